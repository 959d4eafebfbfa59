#!/usr/bin/env bash
# scripts/check_layers.py passes on this tree, and fails on a copy of it
# given an upward include, an include cycle, or a file without a layer:
# each fault named by its file. Exit 77 (skipped) only when python3 is absent.
set -u
root=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipped"; exit 77; }
check="python3 $root/scripts/check_layers.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
$check --root "$root" || { echo "FAILED: the tree's layers do not hold"; fail=1; }

# a copy of the engine's files, spoilt one way at a time: expects exit 1 and
# a line matching $2
spoilt() {
  rm -rf "$tmp/t" && mkdir "$tmp/t" && cp -r "$root/src" "$root/kernels" "$root/launcher" "$tmp/t/"
  (cd "$tmp/t" && eval "$1")
  $check --root "$tmp/t" >"$tmp/out" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || { echo "FAILED: exit $rc, not 1, after: $1"; fail=1; }
  grep -q -- "$2" "$tmp/out" || { echo "FAILED: no '$2' after: $1"; cat "$tmp/out"; fail=1; }
}
# the base layer reaching up to the shard layer's header, and to the umbrella
spoilt 'echo "#include \"../fsdp_shard.h\"" >>src/base/log.h' \
  'src/base/log.h:[0-9]*: base includes ../fsdp_shard.h, of the shard layer above it'
spoilt 'echo "#include \"fsdp.h\"" >>src/dist/comm_impl.h' 'src/dist/comm_impl.h:[0-9]*: dist includes fsdp.h, of the api layer above it'
# dist reaching the ops layer's private header (the BLAS threads)
spoilt 'echo "#include \"../ops/ops.h\"" >>src/dist/boot.c' 'src/dist/boot.c:[0-9]*: dist includes ../ops/ops.h, of the ops layer above it'
# two headers of one layer including each other
spoilt 'printf "#include \"b.h\"\n" >src/io/a.h; printf "#include \"a.h\"\n" >src/io/b.h' \
  'include cycle: src/io/a.h -> src/io/b.h -> src/io/a.h'
# a folder the checker does not place
spoilt 'mkdir src/extra && echo "int x;" >src/extra/x.c' 'src/extra/x.c: has no layer'
[ $fail -eq 0 ] && echo "check_layers: ok"
exit $fail
