#!/usr/bin/env bash
# gpu_unpack.sh: on the lent machine, unpacks .devpack/bundle.tar.xz (made by
# scripts/gpu_bundle.sh: build-gpu/, .devlibs/, build-host/, .whl/peers/ in
# 16 MiB where the folders take 62: the device tool carries 64 MiB in all)
# into the checkout. Does nothing without the pack, or when the pack was
# unpacked already. Run by gpu_check.sh and host_suite.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.devpack/bundle.tar.xz
stamp=.devpack/unpacked
[ -f "$pack" ] || exit 0
[ -f "$stamp" ] && [ "$stamp" -nt "$pack" ] && exit 0
if command -v xz >/dev/null; then
  tar -xJf "$pack"
else # the GPU image may lack xz; Python's tarfile reads it
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(".")' "$pack"
fi
touch "$stamp"
echo "gpu_unpack: $(du -shc build-gpu .devlibs build-host .whl/peers 2>/dev/null | tail -1 | cut -f1) unpacked from $pack"
