#!/usr/bin/env bash
# PMIx_Abort from one rank ends the whole job: fsdprun exits with the abort
# status within 5 s naming the rank, even though the aborting rank itself
# keeps waiting; nothing is left behind.
. "$(dirname "$0")/lib.sh"

fail_case "rank 2 aborts with 7" 7 '^fsdprun: rank 2 called PMIx_Abort with status 7: pmix_probe was asked to abort; stopping the other 3 ranks$' 5000 \
  -n 4 --host "$PROBE" --abort --exit 7 --rank-to-fail 2 --sleep 60 --grandchild --marker $MARK
check "rank 2 aborts: no other failure reported first" "[ \$(grep -c '^fsdprun: rank' '$work/err') = 1 ]"

# status 0 must still read as a failure
fail_case "rank 1 aborts with 0" 1 '^fsdprun: rank 1 called PMIx_Abort with status 0' 5000 \
  -n 2 --host "$PROBE" --abort --exit 0 --rank-to-fail 1 --sleep 60 --marker $MARK

finish
