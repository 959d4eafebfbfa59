#!/usr/bin/env bash
# The project's Python environment, made on demand and never needed to
# train: a virtual environment (.venv/ in the checkout, or FSDP_PYTHON_ENV)
# with Hugging Face `tokenizers` and `pyarrow`, for `fsdp prepare` and the
# tokenizer of `fsdp generate`; `jinja2`, which renders chat templates for
# `fsdp prepare --chat` (the library transformers' apply_chat_template
# renders them with: the same ids); and `tensorboard`, to watch a run's
# train.tensorboard event files (and for the test that reads them back).
#   scripts/python_env.sh            the base environment
#   scripts/python_env.sh --torch    also torch and transformers, for the
#                                    checks against Hugging Face's own code
# Prints the environment's python on stdout (messages go to stderr); exits 1
# when it cannot be made, saying why. Safe to run again: a part already
# installed at these versions is not installed again.
# FSDP_PYTHON=PATH: a Python that already has these packages (a conda
# environment, a machine with no package index): used as it is, after
# checking that they import; nothing is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
env=${FSDP_PYTHON_ENV:-$root/.venv}
py=$env/bin/python
say() { echo "python_env: $*" >&2; }

# pinned: a preparation made today gives the same ids next year
base=(tokenizers==0.23.3 pyarrow==26.0.1 jinja2==3.1.6 tensorboard==2.21.0)
# torch's Linux wheel on PyPI is its CUDA build; its pure-Python deps and
# the four NVIDIA libraries the CUDA toolkit here lacks are enough for it
# to run on the CPU (cuBLAS, cuDNN and the runtime come from the toolkit),
# a gigabyte instead of three
torch=(torch==2.15.0)
torch_deps=(nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.7.2 nvidia-cusparselt-cu13==0.8.1
  nvidia-cufile==1.20.0.107 filelock fsspec jinja2 networkx sympy typing-extensions transformers==5.24.0)

want_torch=0
for a in "$@"; do
  case $a in
    --torch) want_torch=1 ;;
    *) say "unknown option '$a' (expected --torch)"; exit 1 ;;
  esac
done

if [ -n "${FSDP_PYTHON:-}" ]; then
  mods="tokenizers, pyarrow"
  [ $want_torch = 1 ] && mods="$mods, torch, transformers"
  if ! err=$("$FSDP_PYTHON" -c "import $mods" 2>&1); then
    say "FSDP_PYTHON=$FSDP_PYTHON cannot import $mods: $(echo "$err" | tail -1)"
    exit 1
  fi
  echo "$FSDP_PYTHON"
  exit 0
fi

if [ ! -x "$py" ]; then
  say "making $env"
  python3 -m venv "$env" >&2 || { say "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
pip_in() { "$py" -m pip install -q --disable-pip-version-check "$@" >&2; }

mark=$env/.fsdp-base
if [ "$(cat "$mark" 2>/dev/null)" != "${base[*]}" ]; then
  say "installing ${base[*]}"
  pip_in "${base[@]}" || { say "could not install ${base[*]} from PyPI"; exit 1; }
  "$py" -c "import tokenizers, pyarrow, jinja2, tensorboard" || { say "tokenizers, pyarrow, jinja2 or tensorboard does not import"; exit 1; }
  echo "${base[*]}" >"$mark"
fi

if [ $want_torch = 1 ]; then
  mark=$env/.fsdp-torch
  if [ "$(cat "$mark" 2>/dev/null)" != "${torch[*]} ${torch_deps[*]}" ]; then
    say "installing ${torch[*]} and transformers (about 1 GB)"
    pip_in --no-deps "${torch[@]}" && pip_in --no-warn-conflicts "${torch_deps[@]}" ||
      { say "could not install torch and transformers from PyPI"; exit 1; }
    if ! err=$("$py" -c "import torch, transformers; torch.ones(2) @ torch.ones(2)" 2>&1); then
      say "torch does not run here: $(echo "$err" | tail -1)"
      exit 1
    fi
    echo "${torch[*]} ${torch_deps[*]}" >"$mark"
  fi
fi
echo "$py"
