# runs.sh: what the shell tests that train the demo share (sourced after
# checks.sh, with $root set): a work folder removed at exit, with the
# test's background jobs and its Slurm cluster if it started one; the
# short geometry; the losses of a metrics file; the Slurm cluster.
work=$(mktemp -d)
runs_cleanup() {
  kill -9 $(jobs -p) 2>/dev/null
  [ -f "$work/slurm/slurm.conf" ] && bash "$root/tests/scripts/slurm_cluster.sh" stop "$work/slurm"
  rm -rf "$work"
}
trap runs_cleanup EXIT
quick="train.eval_every=0 data.seq=32 data.micro_batch=2 model.num_hidden_layers=1 train.log_every=1000"

# the "loss" of every step record in a metrics file, one per line, as written
losses() { sed -n 's/^{"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$1"; }

# a one-node Slurm cluster of this test's own (tests/scripts/slurm_cluster.sh):
# exports SLURM_CONF and returns 0, or sets slurm_why and returns 1
slurm_up() {
  local conf
  if conf=$(bash "$root/tests/scripts/slurm_cluster.sh" start "$work/slurm" 2>"$work/slurm.err"); then
    export SLURM_CONF=$conf
    return 0
  fi
  slurm_why=$(tail -n 1 "$work/slurm.err")
  return 1
}
