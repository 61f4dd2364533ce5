#!/usr/bin/env bash
# A single-host Slurm for the tests (issue 45): `.ci/slurm.sh start | stop | status`.
#
# start: installs Debian's slurm-wlm, munge and libpmix-dev if missing (root), writes
# /etc/slurm/slurm.conf for this one host and starts munged, slurmctld and slurmd; idempotent
# (a running daemon is left alone, a changed configuration is reloaded by a restart). It waits
# until the node is idle and an `srun true` works, and prints "slurm: up" (exit 0), or says why
# not (exit 1). stop: stops the three daemons it started (by the pid files it wrote).
#
# The configuration is a test cluster's: 24 CPUs declared (several 4-task jobs fit on 2 real
# cores side by side, their ranks mostly asleep), KillWait=20 (SIGKILL 20 s after the time
# limit's SIGTERM: room for a drain on a loaded machine), MinJobAge=120 (a finished job stays
# visible to `scontrol show job` for 2 minutes), AuthInfo=cred_expire=10 and
# SchedulerParameters=sched_interval=5,bf_interval=5 (a requeued job may start again after about
# 15 s instead of 2 minutes), proctrack/linuxproc (no cgroup needed: every descendant of a step
# is signalled, as with cgroups on a real cluster), no accounting; finished jobs are appended to
# /var/log/slurm/jobcomp.log (state and exit code of each allocation).
set -uo pipefail
ETC=/etc/slurm
RUN=/run/durable-dispatch-slurm
LOG=/var/log/slurm
PKGS="slurm-wlm munge libpmix-dev"

die() { echo "slurm: $*" >&2; exit 1; }

install_pkgs() {
    local missing=""
    for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"; done
    [ -z "$missing" ] && return 0
    [ "$(id -u)" -eq 0 ] || die "not root: cannot install$missing"
    command -v apt-get >/dev/null || die "no apt-get: install$missing by hand"
    for attempt in 1 2 3 4 5; do  # another apt may hold the dpkg lock for a minute
        if (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing) \
            >"$RUN/apt.log" 2>&1; then return 0; fi
        sleep 20
    done
    die "installing$missing failed (see $RUN/apt.log)"
}

write_conf() {
    local host; host=$(hostname -s)
    local conf
    conf=$(cat <<EOF
# written by durable-dispatch's .ci/slurm.sh: a one-host test cluster
ClusterName=durable
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=20
MinJobAge=120
InactiveLimit=0
SchedulerParameters=sched_interval=5,bf_interval=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=24 Sockets=1 CoresPerSocket=24 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
    if [ ! -f "$ETC/slurm.conf" ] || [ "$(cat "$ETC/slurm.conf")" != "$conf" ]; then
        printf '%s\n' "$conf" >"$ETC/slurm.conf"
        return 1  # changed
    fi
    return 0
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    mkdir -p "$RUN" "$LOG" /var/spool/slurmctld /var/spool/slurmd /run/munge "$ETC"
    install_pkgs
    local changed=0
    write_conf || changed=1
    if [ "$changed" -eq 1 ]; then stop_daemons quiet; fi
    if [ ! -s /etc/munge/munge.key ]; then
        (command -v mungekey >/dev/null && mungekey -c -f) || \
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged || die "munged did not start"
    fi
    munge -n | unmunge >/dev/null 2>&1 || die "munge does not work (munge -n | unmunge)"
    if ! alive "$RUN/slurmctld.pid"; then
        /usr/sbin/slurmctld || die "slurmctld did not start (see $LOG/slurmctld.log)"
    fi
    if ! alive "$RUN/slurmd.pid"; then
        /usr/sbin/slurmd || die "slurmd did not start (see $LOG/slurmd.log)"
    fi
    local host; host=$(hostname -s)
    for _ in $(seq 60); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null)
        case "$state" in
            idle*|mixed*|allocated*) break ;;
            down*|drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 ;;
        esac
        sleep 1
    done
    case "$state" in idle*|mixed*|allocated*) ;; *) die "node $host is '$state' (see $LOG/)";; esac
    timeout 60 srun -N1 -n1 -t 1 true || die "srun true failed"
    echo "slurm: up ($host, $(sinfo -h -o '%c CPUs, partition %P'))"
}

stop_daemons() {
    for d in slurmd slurmctld; do
        if alive "$RUN/$d.pid"; then
            pid=$(cat "$RUN/$d.pid"); kill "$pid"
            for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        fi
        rm -f "$RUN/$d.pid"
    done
    [ "${1:-}" = quiet ] || echo "slurm: stopped"
}

stop() {
    scancel --quiet --user=root 2>/dev/null || true  # nothing of ours is left running
    stop_daemons
    if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
}

status() {
    for d in "/run/munge/munged.pid" "$RUN/slurmctld.pid" "$RUN/slurmd.pid"; do
        if alive "$d"; then echo "$(basename "$d" .pid): running ($(cat "$d"))"; else echo "$(basename "$d" .pid): not running"; fi
    done
    sinfo 2>/dev/null
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
