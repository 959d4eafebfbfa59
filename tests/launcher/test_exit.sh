#!/usr/bin/env bash
# A rank that exits 3 ends the job: fsdprun exits 3 within 5 s naming
# rank 2; the other ranks (sleeping, each with a child of its own) are
# stopped; no process and no temp directory is left. So does a rank that
# exits 0 before it joins the job while the others wait for it (exit 1).
. "$(dirname "$0")/lib.sh"

fail_case "rank 2 exits 3" 3 '^fsdprun: rank 2 exited with status 3; stopping the other 3 ranks$' 5000 \
  -n 4 --host "$PROBE" --exit 3 --rank-to-fail 2 --sleep 60 --grandchild --marker $MARK
# rank 2 got past the collecting fence, so every rank had joined the job
check "rank 2 exits 3: the job had started" "grep -qx '\[2\] rank 2 of 4 local 2/4 ok' '$work/out'"

# rank 0 leads the ranks' process group: its early end must not let the
# others (or their children) escape
fail_case "rank 0 exits 4" 4 '^fsdprun: rank 0 exited with status 4' 5000 \
  -n 3 --host "$PROBE" --exit 4 --rank-to-fail 0 --sleep 60 --grandchild --marker $MARK

# a rank dying before PMIx_Init leaves the others waiting in their fence:
# only the launcher can end that job
fail_case "rank 3 fails before PMIx_Init" 5 '^fsdprun: rank 3 exited with status 5' 5000 \
  -n 4 --host "$PROBE" --fail-early 5 --rank-to-fail 3 --marker $MARK

# so does one that ends with status 0 before PMIx_Init (a recipe calling
# os.exit on one rank): a failure, not a rank that finished early
fail_case "rank 3 exits 0 before PMIx_Init" 1 \
  '^fsdprun: rank 3 exited with status 0 before it joined the job \(it never reached fsdp_init' 5000 \
  -n 4 --host "$PROBE" --fail-early 0 --rank-to-fail 3 --marker $MARK

# ranks that ignore SIGTERM get SIGKILL when the grace period ends
t0=$(ms)
fail_case "--grace 1, ranks ignoring SIGTERM" 6 'rank 1 exited with status 6' 5000 \
  -n 3 --grace 1 --host "$PROBE" --exit 6 --rank-to-fail 1 --sleep 60 --ignore-term --marker $MARK
dt=$(($(ms) - t0))
check "--grace 1: the SIGKILL came after the grace period ($dt ms)" "[ $dt -ge 900 ]"

# a program that cannot be started at all
fail_case "a rank program that is not executable" 2 'cannot run the rank program' 5000 \
  -n 2 --host "$work/no-such-program" --marker $MARK

finish
