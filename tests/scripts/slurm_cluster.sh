#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, for running the ranks
# under `srun --mpi=pmix` in tests (../shared/notes/LAUNCHERS.md). Nothing
# under /etc is read or changed: its slurm.conf, state, logs and pid files
# live in DIR, its daemons listen on free ports, and it authenticates with
# auth/none (no munge key needed; only for a test on one machine).
#   slurm_cluster.sh start DIR   starts slurmctld and slurmd, waits until the
#                                node is idle, prints the slurm.conf to export
#                                as SLURM_CONF; exit 1 (logs printed) if not
#   slurm_cluster.sh stop DIR    stops both (by their pid files)
# Needs root (slurmd starts tasks as the job's user) and Debian's slurmctld,
# slurmd and slurm-client.
set -u
cmd=${1:-}
dir=${2:-}
[ -n "$dir" ] || { echo "usage: slurm_cluster.sh start|stop DIR" >&2; exit 2; }

stop() {
  for d in slurmd slurmctld; do
    [ -f "$dir/$d.pid" ] && kill "$(cat "$dir/$d.pid")" 2>/dev/null
  done
  for _ in $(seq 50); do
    alive=0
    for d in slurmd slurmctld; do
      [ -f "$dir/$d.pid" ] && kill -0 "$(cat "$dir/$d.pid")" 2>/dev/null && alive=1
    done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for d in slurmd slurmctld; do [ -f "$dir/$d.pid" ] && kill -9 "$(cat "$dir/$d.pid")" 2>/dev/null; done
  return 0
}

case $cmd in
stop) stop; exit 0 ;;
start) ;;
*) echo "usage: slurm_cluster.sh start|stop DIR" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root (slurmd starts the job's tasks as its user)" >&2; exit 1; }
for b in slurmctld slurmd srun sinfo; do
  command -v "$b" >/dev/null || { echo "slurm_cluster.sh: $b is not installed" >&2; exit 1; }
done
mkdir -p "$dir/state" "$dir/spool"
# two free TCP ports, as the kernel hands them out
read -r ctld_port d_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
cat >"$dir/slurm.conf" <<EOF
ClusterName=fsdptest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
KillWait=5
SlurmdParameters=config_overrides
NodeName=localhost CPUs=8 State=UNKNOWN
PartitionName=fsdptest Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$dir/slurm.conf
if slurmctld -f "$SLURM_CONF" && slurmd -f "$SLURM_CONF" -N localhost; then
  for _ in $(seq 100); do
    if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
      echo "$SLURM_CONF"
      exit 0
    fi
    sleep 0.1
  done
fi
echo "slurm_cluster.sh: the node did not come up within 10 s; logs:" >&2
tail -n 20 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 2>/dev/null
stop
exit 1
