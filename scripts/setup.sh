#!/usr/bin/env bash
# Installs the Debian packages fsdp needs to build, when they are missing.
# Safe to run again: it installs nothing that is already there.
# The CUDA toolkit and NCCL are not Debian packages here; the build uses them
# when found (/usr/local/cuda) and builds the CPU backend alone otherwise.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential cmake ninja-build pkg-config libluajit-5.1-dev luajit libpmix-dev libreadline-dev libopenblas-dev libcjson-dev clang libclang-rt-dev python3 python3-pip gnuplot-nox; do
  have_pkg "$p" || need+=("$p")
done

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# cuDNN frontend headers (header-only C++, from PyPI's nvidia-cudnn-frontend
# wheel) for the cuDNN fused attention (kernels/attention_cudnn.cpp). Only
# its include/ folder is kept, in .deps/; the build compiles the cuDNN path
# when these headers and the CUDA toolkit's cudnn.h are there, and goes on
# without it (our own attention kernels) when they cannot be had.
cudnn_fe_version=1.32.0
cudnn_fe_dir=.deps/cudnn-frontend-$cudnn_fe_version
if [ -f /usr/local/cuda/include/cudnn.h ] && [ ! -f "$cudnn_fe_dir/include/cudnn_frontend.h" ]; then
  echo "setup: fetching the cuDNN frontend headers $cudnn_fe_version (PyPI: nvidia-cudnn-frontend)"
  tmp=$(mktemp -d)
  # any one wheel will do: the headers are the same in each
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$cudnn_fe_version" >/dev/null 2>&1; then
    python3 - "$tmp" "$cudnn_fe_dir" <<'PY' || echo "setup: could not unpack the cuDNN frontend wheel" >&2
import glob, os, shutil, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
part = sys.argv[2] + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    z.extractall(part, [n for n in z.namelist() if n.startswith("include/")])
os.rename(part, sys.argv[2])
PY
  else
    echo "setup: could not download nvidia-cudnn-frontend $cudnn_fe_version; building without cuDNN attention" >&2
  fi
  rm -rf "$tmp"
fi
