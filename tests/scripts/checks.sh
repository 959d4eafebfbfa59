# checks.sh: the shell test scripts' checks (sourced). check NAME COMMAND
# runs COMMAND (eval) and prints "ok: NAME" or "FAILED: NAME"; finish LABEL
# prints the counts and returns non-zero if anything failed.
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
finish() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}
