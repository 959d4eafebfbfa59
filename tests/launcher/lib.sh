# Shared by the launcher test scripts (sourced): argument handling, a fresh
# TMPDIR, checks that print what they test, and leftover detection.
#   test_X.sh FSDPRUN PMIX_PROBE
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 FSDPRUN PMIX_PROBE" >&2
  exit 2
fi
LAUNCHER=$1
PROBE=$2
ulimit -c 0 # ranks killed by SIGSEGV on purpose: no core files
unset FSDPRUN_HOST # a caller's setting would change what fsdprun starts
passed=0
failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# fsdprun makes its PMIx directory under TMPDIR: a fresh one shows leftovers
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"
# a marker in every command line of this script's processes, for pgrep
MARK="launcher-test-$$"

ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

ms() { echo $(($(date +%s%N) / 1000000)); }

# Processes (ranks, their children) still carrying marker $1.
leftovers() { pgrep -f -- "--marker $1( |\$)" || true; }

# After fsdprun returned: nothing of its job may remain, and no temp dir.
no_leftovers() { # what marker
  local left=""
  for _ in 1 2 3 4 5; do # a SIGKILLed process can take a moment to vanish
    left=$(leftovers "$2")
    [ -z "$left" ] && break
    sleep 0.1
  done
  check "$1: no rank or child of a rank left" "[ -z \"$left\" ]"
  if [ -n "$left" ]; then
    ps -o pid,ppid,pgid,stat,args -p "$(echo $left | tr ' ' ,)" || true
    kill -9 $left 2>/dev/null || true
  fi
  check "$1: no temp directory left in TMPDIR" "[ -z \"\$(ls -A '$TMPDIR')\" ]"
  rm -rf "${TMPDIR:?}"/*
}

# Waits (30 s at most: the suite runs tests side by side, and ranks can be
# slow to start on busy cores) until file $3 has $1 lines matching regex $2.
wait_lines() {
  for _ in $(seq 600); do
    [ "$(grep -Ec -- "$2" "$3" 2>/dev/null)" -ge "$1" ] && return 0
    sleep 0.05
  done
  return 1
}

# Sends signal $2 to process $1 and waits for it: its status in $rc, the
# milliseconds it took in $dt.
signal_and_wait() {
  local t0
  t0=$(ms)
  kill -"$2" "$1"
  wait "$1"
  rc=$?
  dt=$(($(ms) - t0))
}

finish() {
  echo "$(basename "$0"): $passed passed, $failed failed"
  [ "$failed" = 0 ]
}

# A job that fails: fsdprun must exit with the expected status within the
# limit, name the failed rank on stderr, and leave nothing behind.
#   fail_case NAME EXPECTED_RC MESSAGE_REGEX LIMIT_MS fsdprun-args...
fail_case() {
  local name=$1 want=$2 msg=$3 limit=$4
  shift 4
  local t0 rc dt before=$failed
  t0=$(ms)
  "$LAUNCHER" "$@" >"$work/out" 2>"$work/err"
  rc=$?
  dt=$(($(ms) - t0))
  check "$name: fsdprun exits $want (got $rc)" "[ $rc = $want ]"
  check "$name: within $limit ms (took $dt ms)" "[ $dt -le $limit ]"
  check "$name: stderr says '$msg'" "grep -Eq '$msg' '$work/err'"
  [ "$failed" = "$before" ] || sed 's/^/    stderr: /' "$work/err" | tail -5
  no_leftovers "$name" $MARK
}
