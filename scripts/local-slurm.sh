#!/usr/bin/env bash
# A real single-node Slurm on this machine, for GPUlayer's slurm provider tests and for
# trying the provider by hand.
#
#   scripts/local-slurm.sh start    # install Debian's packages if absent, write the config, start
#   scripts/local-slurm.sh status   # daemons, partitions, node, queue
#   scripts/local-slurm.sh stop     # stop the daemons (the state dir stays; start again reuses it)
#   scripts/local-slurm.sh env      # print the export line for your shell
#
# Everything lives under one directory ($GPULAYER_SLURM_DIR, default /tmp/gpulayer-slurm):
# slurm.conf, gres.conf, the munge key and socket, state, logs, and fake GPU device nodes
# (dev/nvidia0..N made with mknod, character major 195 like NVIDIA's) that gres.conf names.
# Nothing under /etc is used or changed: point Slurm's commands at it with
# SLURM_CONF=$GPULAYER_SLURM_DIR/slurm.conf.
#
# The cluster: one node "localhost" (127.0.0.1) with $GPULAYER_SLURM_CPUS CPUs (default 16),
# $GPULAYER_SLURM_GPUS fake GPUs (default 4, GRES gpu:fake) and $GPULAYER_SLURM_MEMORY_MB
# of memory (default 16384), in three partitions over the same node: "gpu" (the default),
# "debug", and "short" (MaxTime 10 minutes: a job asking for more is accepted and stays
# pending, reason PartitionTimeLimit). The settings work without cgroups (containers, VMs without systemd):
# proctrack/linuxproc, task/none, no accounting. Ports 16817/16818 (slurmctld/slurmd), so a
# real Slurm on the default ports is left alone.
#
# Missing packages are installed with apt-get unless GPULAYER_SLURM_INSTALL=0 (then: exit 3).
# Runs as root (slurmd must, to run jobs as their users); a non-root caller gets sudo.
set -euo pipefail

DIR=${GPULAYER_SLURM_DIR:-/tmp/gpulayer-slurm}
CPUS=${GPULAYER_SLURM_CPUS:-16}
GPUS=${GPULAYER_SLURM_GPUS:-4}
MEMORY_MB=${GPULAYER_SLURM_MEMORY_MB:-16384}
CTLD_PORT=${GPULAYER_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${GPULAYER_SLURM_SLURMD_PORT:-16818}
PACKAGES=(slurmctld slurmd slurm-client munge)
CONF=$DIR/slurm.conf

if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=GPULAYER_SLURM_DIR,GPULAYER_SLURM_INSTALL,GPULAYER_SLURM_CPUS,GPULAYER_SLURM_GPUS,GPULAYER_SLURM_MEMORY_MB,GPULAYER_SLURM_CTLD_PORT,GPULAYER_SLURM_SLURMD_PORT "$0" "$@"
fi

say() { echo "local-slurm: $*"; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${GPULAYER_SLURM_INSTALL:-1}" = 0 ]; then
    say "not installed: ${missing[*]} (apt-get install ${missing[*]}, or run without GPULAYER_SLURM_INSTALL=0)"
    exit 3
  fi
  say "installing ${missing[*]} (Debian packages)"
  apt-get update -qq
  # policy-rc.d or no init system: the packages' own services are not started; we start ours.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
  mkdir -p "$DIR"/{munge,run,log,state/ctld,state/slurmd,dev,jobs}
  chmod 755 "$DIR/munge"  # the socket must be reachable; the key itself is 0400
  if [ ! -s "$DIR/munge/munge.key" ]; then
    # 1024 random bytes, as mungekey(8) makes; the key never leaves this directory.
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
  fi
  local i
  for ((i = 0; i < GPUS; i++)); do
    if [ ! -e "$DIR/dev/nvidia$i" ]; then
      # A character device with NVIDIA's major number; a plain file where mknod is refused.
      mknod "$DIR/dev/nvidia$i" c 195 "$i" 2>/dev/null || touch "$DIR/dev/nvidia$i"
    fi
  done
  local gres_line="" gres_conf=""
  if [ "$GPUS" -gt 0 ]; then
    gres_line=" Gres=gpu:fake:$GPUS"
    gres_conf="NodeName=localhost Name=gpu Type=fake File=$DIR/dev/nvidia[0-$((GPUS - 1))]"
  fi
  cat >"$CONF.new" <<EOF
# Written by scripts/local-slurm.sh: a single-node Slurm for GPUlayer's tests.
ClusterName=gpulayer
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# No cgroups: works in containers and VMs without systemd.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
# The node is described, not probed: more CPUs than this machine has is fine.
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY_MB$gres_line State=UNKNOWN
PartitionName=gpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=localhost MaxTime=INFINITE State=UP
PartitionName=short Nodes=localhost MaxTime=00:10:00 State=UP
EOF
  echo "$gres_conf" >"$DIR/gres.conf.new"
  CHANGED=0
  for f in "$CONF" "$DIR/gres.conf"; do
    if ! cmp -s "$f.new" "$f"; then CHANGED=1; fi
    mv -f "$f.new" "$f"
  done
}

start_munge() {
  pid_alive "$DIR/run/munged.pid" && return 0
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  local i
  for ((i = 0; i < seconds * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  say "$what did not come up within ${seconds}s; see $DIR/log/"
  tail -n 20 "$DIR"/log/*.log >&2 || true
  return 1
}

node_ready() {
  local state
  state=$(SLURM_CONF=$CONF sinfo -h -n localhost -o %T 2>/dev/null | head -n1)
  case "$state" in idle* | mixed* | allocated* | completing*) return 0 ;; *) return 1 ;; esac
}

start() {
  install_packages
  write_config
  export SLURM_CONF=$CONF
  if [ "$CHANGED" = 1 ] && { pid_alive "$DIR/run/slurmctld.pid" || pid_alive "$DIR/run/slurmd.pid"; }; then
    say "the configuration changed: restarting slurmctld and slurmd"
    stop_pid slurmd "$DIR/run/slurmd.pid"
    stop_pid slurmctld "$DIR/run/slurmctld.pid"
  fi
  start_munge
  wait_for 10 munged munge -n --socket="$DIR/munge/munge.socket"
  if ! pid_alive "$DIR/run/slurmctld.pid"; then
    slurmctld -f "$CONF"
  fi
  wait_for 30 slurmctld scontrol ping
  if ! pid_alive "$DIR/run/slurmd.pid"; then
    slurmd -f "$CONF" -N localhost
  fi
  wait_for 30 "the node" node_ready || {
    # A node left down or drained by an earlier run comes back on request.
    scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
    wait_for 30 "the node" node_ready
  }
  say "running: $(sinfo -h -o '%P %D %T %G' | tr '\n' ';')"
  usage
}

stop_pid() {  # stop_pid NAME PIDFILE
  local pidfile=$2 pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for ((i = 0; i < 80; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then
      say "$1 (pid $pid) did not stop; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

stop() {
  if [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid"; then
    # Jobs first, so no worker a test started outlives the cluster.
    SLURM_CONF=$CONF scancel --full --quiet --user=root 2>/dev/null || true
  fi
  stop_pid slurmd "$DIR/run/slurmd.pid"
  stop_pid slurmctld "$DIR/run/slurmctld.pid"
  stop_pid munged "$DIR/run/munged.pid"
  say "stopped (state kept in $DIR)"
}

status() {
  local name
  for name in munged slurmctld slurmd; do
    if pid_alive "$DIR/run/$name.pid"; then echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"; else echo "$name: stopped"; fi
  done
  if pid_alive "$DIR/run/slurmctld.pid"; then
    SLURM_CONF=$CONF sinfo -o '%P %a %D %T %c %m %G'
    SLURM_CONF=$CONF squeue
  fi
  pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid"
}

usage() {
  cat <<EOF
Use it with:  export SLURM_CONF=$CONF
  sinfo; sbatch --gres=gpu:1 --wrap 'env | grep -E "SLURM_JOB_ID|CUDA_VISIBLE"'; squeue
A providers.toml section for it:  [slurm]  type = "slurm"  partitions = ["gpu"]  slurm_conf = "$CONF"
Logs: $DIR/log/   Stop: $0 stop
EOF
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
