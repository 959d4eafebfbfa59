#!/usr/bin/env bash
# The peers of bench/llama_vs_peer.sh (Megatron-FSDP, DeepSpeed) as wheels
# for a GPU machine that reaches no package registry. Bench-only: fetched on
# demand into a git-ignored folder, never committed.
#   scripts/peer_wheels.sh [DIR]            here, online: fills DIR (default .whl/peers)
#   scripts/peer_wheels.sh --install [DIR]  there, offline: installs DIR's wheels
#                                           beside the machine's torch; prints the folder
#                                           to put first on PYTHONPATH (and its bin/ on PATH)
# Download: megatron-fsdp and einops (pure Python); DeepSpeed, an sdist on
# PyPI, built here into a pure-Python wheel (DS_BUILD_OPS=0: its ops are
# compiled at run time, FusedAdam and CPU Adam by torch's JIT with ninja)
# with a Python that has torch (PYTHON, default .venv/bin/python, made by
# scripts/python_env.sh --torch), so the GPU machine builds nothing; and
# the DeepSpeed requirements that a torch + transformers image may lack
# (transformers already brings numpy, packaging, tqdm), for the GPU
# machine's Python (PEER_PY, default 3.12: the lent H200's) and x86-64.
# Install: pip install --no-index --no-deps --target (the image's python3
# is itself a venv, so a venv over it would not see its torch); a stamp of
# the wheels' names and sizes makes a second call a no-op.
# The device tool carries at most 64 MiB with the tree: it prints the size.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --install ]; then
  dir=${2:-.whl/peers}
  site=${PEER_SITE:-/tmp/fsdp-peer-site}
  py=${PYTHON:-python3}
  ls "$dir"/*.whl >/dev/null 2>&1 || { echo "peer_wheels: no wheels in $dir (run scripts/peer_wheels.sh where pip reaches PyPI)" >&2; exit 2; }
  stamp=$(cd "$dir" && ls -l -- *.whl | awk '{print $5, $NF}')
  if [ "$(cat "$site/.peer_wheels" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$site" "$dir"/*.whl >&2
    printf '%s\n' "$stamp" >"$site/.peer_wheels"
  fi
  echo "$site"
  exit 0
fi

dir=${1:-.whl/peers}
pyver=${PEER_PY:-3.12}
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
"$py" -c 'import torch' 2>/dev/null ||
  { echo "peer_wheels: $py has no torch, which DeepSpeed's setup.py imports (scripts/python_env.sh --torch)" >&2; exit 2; }
MEGATRON_FSDP=megatron-fsdp==0.6.1 DEEPSPEED=0.19.8
rm -rf "$dir"
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=("$py" -m pip --disable-pip-version-check -q)
"${pip[@]}" download --no-deps -d "$dir" "$MEGATRON_FSDP" einops==0.8.2 hjson==3.1.0 py-cpuinfo==9.0.0 \
  nvidia-ml-py==13.615.71 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
# compiled ones for the GPU machine's Python, not this one's
"${pip[@]}" download --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
  -d "$dir" pydantic-core==2.50.5 msgpack==1.2.4 ninja==1.13.2 psutil==7.2.2
"${pip[@]}" download --no-deps --no-binary=:all: -d "$tmp" "deepspeed==$DEEPSPEED"
# setuptools here lacks bdist_wheel without the wheel package: a private copy
"$py" -c 'import wheel' 2>/dev/null || "${pip[@]}" install --target "$tmp/build" wheel
DS_BUILD_OPS=0 DS_ACCELERATOR=cuda PYTHONPATH="$tmp/build${PYTHONPATH:+:$PYTHONPATH}" \
  "${pip[@]}" wheel --no-deps --no-build-isolation -w "$dir" "$tmp/deepspeed-$DEEPSPEED.tar.gz" >/dev/null
ls -l "$dir"
du -cb "$dir"/*.whl | tail -1 | awk '{printf "peer_wheels: %.1f MiB in %s\n", $1 / 1048576, "'"$dir"'"}'
