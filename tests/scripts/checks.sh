# checks.sh: the shell test scripts' checks (sourced). check NAME COMMAND
# runs COMMAND (eval) and prints "ok: NAME" or "FAILED: NAME" (and returns
# 1, so that `check ... || cat log` shows why); finish LABEL
# prints the counts and returns non-zero if anything failed.
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; return 1; fi; } # (status 1: `check ... || diagnostics` prints them)
finish() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" = 0 ]
}

# fixed_recipe DIR ROOT: DIR/fixed.lua, the tiny recipe (ROOT/recipes/tiny.lua)
# trained on DIR/text.txt: fixed data, not the recipe's corpus (this
# repository's sources, which change with every commit, and with them any
# drift measured on them): 64 KiB of words drawn by a Park-Miller generator
# (exact in awk's doubles).
fixed_recipe() {
  awk 'BEGIN { split("the shard of a unit is gathered before its forward and reduced after backward while next layer", w, " ")
    s = 12345; n = 0
    while (n < 65536) { s = (s * 16807) % 2147483647; t = w[s % 16 + 1] (s % 11 == 0 ? ".\n" : " "); printf "%s", t; n += length(t) } }' \
    >"$1/text.txt"
  cat >"$1/fixed.lua" <<EOF
local r = dofile("$2/recipes/tiny.lua")
r.data.corpus = { root = "$1", include = { "text.txt" } }
return r
EOF
}

# hf_jobs PY DIR JOB...: the checks against transformers named by the JOBs
# (NAME<tab>SCRIPT<tab>ARG..., tests/scripts/hf_jobs.py) in one Python
# process, their outputs and statuses in DIR; job_rc DIR NAME prints a
# job's status (none: 3) and its output, without transformers' loading chatter
hf_jobs() {
  local py=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  "$py" "$(dirname "${BASH_SOURCE[0]}")/hf_jobs.py" "$dir" "$@" >"$dir/jobs.log" 2>&1 || cat "$dir/jobs.log" >&2
}
job_rc() {
  [ -f "$1/$2.out" ] && grep -v "Loading weights" "$1/$2.out" >&2
  cat "$1/$2.rc" 2>/dev/null || echo 3
}

# python_env_or_skip ROOT: the project's Python environment (scripts/
# python_env.sh), made if need be; where it cannot be, says why and exits
# the test with 77 (skipped)
python_env_or_skip() {
  local err
  if ! err=$("$1/scripts/python_env.sh" 2>&1 >/dev/null); then
    echo "skipped: the project's Python environment: $(echo "$err" | tail -1)"
    exit 77
  fi
}

# fresh_clone DIR FSDP FSDPRUN ROOT: DIR laid out as a fresh clone for a
# recipe's header commands (build/fsdp, build/fsdprun, recipes/, docs/,
# README.md; no runs/)
fresh_clone() {
  mkdir -p "$1/build"
  ln -s "$2" "$1/build/fsdp"
  ln -s "$3" "$1/build/fsdprun"
  ln -s "$4/recipes" "$4/docs" "$4/README.md" "$1/"
}
