#!/usr/bin/env bash
# test_check_calls.sh ROOT BUILD: scripts/check_calls.py finds no call
# circle among the build's files of src/, kernels/ and launcher/, and does
# find one it is shown: two objects that call each other, and a circle of
# three (each named with the functions of its edges); a chain passes.
set -u
root=$1 build=$2
. "$(dirname "$0")/checks.sh"
command -v nm >/dev/null && command -v cc >/dev/null || { echo "skipped: no nm or cc"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$root/scripts/check_calls.py" "$build" >"$tmp/out" 2>&1
rc=$?
check "no call circle among the engine's and the launcher's files (status $rc)" "[ $rc = 0 ]" || cat "$tmp/out"
obj() { echo "$2" >"$tmp/$1.c" && cc -c -o "$tmp/$1.o" "$tmp/$1.c"; }
obj a 'int b_f(void); int a_f(void) { return b_f(); } int a_g(void) { return 0; }'
obj b 'int a_g(void); int b_f(void) { return a_g(); }'
obj c 'int c_f(void) { return 1; }'
python3 "$root/scripts/check_calls.py" "$tmp/a.o" "$tmp/b.o" "$tmp/c.o" >"$tmp/out" 2>&1
rc=$?
check "two files calling each other: status 1, both named with the functions" \
  "[ $rc = 1 ] && grep -q 'a call circle among a, b' '$tmp/out' && grep -q 'a calls b: b_f' '$tmp/out' && grep -q 'b calls a: a_g' '$tmp/out'" ||
  cat "$tmp/out"
obj a 'int b_f(void); int a_f(void) { return b_f(); }'
obj b 'int c_f(void); int b_f(void) { return c_f(); }'
obj c 'int c_f(void) { return 1; }'
python3 "$root/scripts/check_calls.py" "$tmp/a.o" "$tmp/b.o" "$tmp/c.o" >"$tmp/out" 2>&1
check "a chain of calls: no circle" "[ $? = 0 ]" || cat "$tmp/out"
obj c 'int a_f(void); int c_f(void) { return a_f(); }'
python3 "$root/scripts/check_calls.py" "$tmp/a.o" "$tmp/b.o" "$tmp/c.o" >"$tmp/out" 2>&1
check "a circle of three files: named" "[ $? = 1 ] && grep -q 'a call circle among a, b, c' '$tmp/out'" || cat "$tmp/out"
finish test_check_calls
