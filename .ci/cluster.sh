#!/usr/bin/env bash
# A cluster in a box for the multi-node tests (marker "cluster"):
#   .ci/cluster.sh start | stop | status | kill-node I | cut I | heal I | agent HOST CMD...
#
# N nodes (DD_CLUSTER_NODES, default 3) named ddnode1..ddnodeN, each:
# - a network namespace (/run/netns/ddnodeI) whose only link is a veth on the bridge ddbox0
#   (10.60.0.0/24: the node is 10.60.0.(10+I), this host 10.60.0.1 on the bridge; no route out,
#   no forwarding: the traffic stays between the namespaces made here and this host's bridge
#   address, where the controller listens);
# - its own hostname (UTS namespace) and mount namespace with a private tmpfs on /dev/shm and on
#   /run/ddbox-node (the node's Slurm spool and Slurm's TmpFS): a node that dies loses them as a
#   real node's reboot would, and the per-step PMIx directories of two nodes never collide.
#   These namespaces are held by a holder process (`sleep infinity`) in the node; every process
#   of the node lives in its network namespace (`ip netns pids ddnodeI`);
# - a slurmd of a second Slurm cluster ("ddbox": /etc/slurm-box/slurm.conf, slurmctld on this
#   host at 10.60.0.1:6917, slurmd on 6918), beside the single-host one of .ci/slurm.sh (6817,
#   6818, /etc/slurm/slurm.conf): both run at once. Its clients need SLURM_CONF=$CONF. Each node
#   declares 4 CPUs (the host has 2: pass Open MPI --bind-to none); SlurmdTimeout=30, so a dead
#   or cut node is marked down 30-40 s after, its job ended NODE_FAIL and requeued if it may be;
#   ReturnToService=2 takes a node back when its slurmd registers again.
# The filesystem is otherwise shared (as a cluster's), /tmp included.
#
# Nodes are entered with `nsenter --target HOLDER --net --uts --mount` (never `ip netns exec`,
# which remounts /sys: slurmd then finds no cgroup filesystem). `agent` is the launch agent for
# Open MPI without Slurm (`mpiexec --prtemca plm_ssh_agent "$PWD/.ci/cluster.sh agent" --host
# ddnode1:2,...`; PRRTE ignores plm_rsh_agent): it runs PRRTE's daemon command inside the
# named node with a fresh environment, as ssh would; its process is in the node (a killed node
# kills it, as a dying sshd ends its ssh).
#
# kill-node I: every process of the node is SIGKILLed (slurmd and the holder included): the
#   kernel closes its connections at once, so its peers see it die (not a silent node). Its
#   tmpfs (spool, /dev/shm) goes with it; `start` brings it back fresh.
# cut I: the node's bridge port leaves the bridge (its link stays up, its packets go nowhere):
#   a silent node, as behind a failed switch port (this kernel has no netem). heal I: the port
#   rejoins the bridge.
# start: idempotent (installs slurm-wlm, munge and libpmix-dev if missing, writes the
#   configuration, makes what is missing, brings killed nodes back and heals cut links), waits
#   until every node is idle and `srun -N N hostname` prints N names; prints "cluster: up".
# stop: cancels the box's jobs, kills every node, removes the namespaces and the bridge and
#   stops the box's slurmctld (munged is left to .ci/slurm.sh when its Slurm is running).
# Root only: elsewhere it says so and exits 1 (the tests skip with the reason).
set -uo pipefail  # (no `grep -q` after a pipe: its early exit fails the pipeline)
N=${DD_CLUSTER_NODES:-3}
CONF_DIR=/etc/slurm-box
CONF=$CONF_DIR/slurm.conf
RUN=/run/ddbox
NODE_RUN=/run/ddbox-node  # a private tmpfs inside each node (an empty directory here)
LOG=/var/log/slurm-box
BR=ddbox0
NET=10.60.0
HEAD_ADDR=$NET.1
CTLD_PORT=6917
SLURMD_PORT=6918
PKGS="slurm-wlm munge libpmix-dev"
export SLURM_CONF=$CONF

die() { echo "cluster: $*" >&2; exit 1; }
node() { echo "ddnode$1"; }
addr() { echo "$NET.$((10 + $1))"; }
port() { echo "ddv$1"; }  # the node's bridge port (this host's end of its veth)
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
holder() { cat "$RUN/$(node "$1").holder" 2>/dev/null; }
holder_alive() { local p; p=$(holder "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null \
    && [ "$(readlink "/proc/$p/ns/net")" = "$(nsenter --net="/run/netns/$(node "$1")" readlink /proc/self/ns/net 2>/dev/null)" ]; }
enter() { local i=$1; shift; nsenter --target "$(holder "$i")" --net --uts --mount -- "$@"; }
check_index() { [[ "${1:-}" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$N" ] || die "no node '${1:-}' (1..$N)"; }

install_pkgs() {
    local missing=""
    for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "ok installed" >/dev/null || missing="$missing $p"; done
    [ -z "$missing" ] && return 0
    command -v apt-get >/dev/null || die "no apt-get: install$missing by hand"
    for _ in 1 2 3 4 5; do  # another apt may hold the dpkg lock for a minute
        if (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing) \
            >"$RUN/apt.log" 2>&1; then return 0; fi
        sleep 20
    done
    die "installing$missing failed (see $RUN/apt.log)"
}

write_conf() {
    local head; head=$(hostname -s)
    local nodes="" names=""
    for i in $(seq "$N"); do
        nodes+="NodeName=$(node "$i") NodeAddr=$(addr "$i") CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"$'\n'
        names+="${names:+,}$(node "$i")"
    done
    local conf
    conf=$(cat <<EOF
# written by durable-dispatch's .ci/cluster.sh: a test cluster of $N nodes in network namespaces
ClusterName=ddbox
SlurmctldHost=$head($HEAD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld-box
SlurmdSpoolDir=$NODE_RUN/spool
TmpFS=$NODE_RUN/tmp
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
KillWait=10
MinJobAge=300
InactiveLimit=0
SchedulerParameters=sched_interval=5,bf_interval=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
${nodes}PartitionName=box Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
    if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$conf" ]; then
        printf '%s\n' "$conf" >"$CONF"
        return 1  # changed
    fi
    return 0
}

net_up() {  # the bridge, and node I's namespace, veth and address; idempotent
    if ! ip link show "$BR" >/dev/null 2>&1; then
        ip link add "$BR" type bridge || die "cannot make the bridge $BR"
    fi
    ip addr show dev "$BR" | grep "inet $HEAD_ADDR/" >/dev/null || ip addr add "$HEAD_ADDR/24" dev "$BR"
    ip link set "$BR" up
    local i=$1 n p; n=$(node "$i"); p=$(port "$i")
    [ -e "/run/netns/$n" ] || ip netns add "$n" || die "cannot make the namespace $n"
    if ! ip link show "$p" >/dev/null 2>&1; then
        ip link add "$p" type veth peer name eth0 netns "$n" || die "cannot make the veth of $n"
    fi
    ip link set "$p" master "$BR" up  # (also heals a cut link)
    nsenter --net="/run/netns/$n" sh -c "
        ip link set lo up
        ip addr show dev eth0 | grep -q 'inet $(addr "$i")/' || ip addr add $(addr "$i")/24 dev eth0
        ip link set eth0 up"
}

node_up() {  # node I's holder (hostname, private tmpfs) and slurmd; idempotent
    local i=$1 n; n=$(node "$i")
    net_up "$i"
    if ! holder_alive "$i"; then
        kill_node "$i" quiet  # what is left of an earlier life of the node
        mkdir -p "$NODE_RUN"
        # unshare without --fork execs the holder in its own process: $! is the holder
        setsid nsenter --net="/run/netns/$n" -- unshare --mount --uts --propagation private -- \
            sh -c "hostname $n && mount -t tmpfs -o mode=0755,size=256m ddnode $NODE_RUN &&
                   mkdir -p $NODE_RUN/spool $NODE_RUN/tmp && chmod 1777 $NODE_RUN/tmp &&
                   mount -t tmpfs -o mode=1777,size=256m ddshm /dev/shm &&
                   exec sleep infinity" </dev/null >/dev/null 2>&1 &
        echo $! >"$RUN/$n.holder"
        for _ in $(seq 50); do
            [ "$(enter "$i" hostname 2>/dev/null)" = "$n" ] && \
                enter "$i" mountpoint -q "$NODE_RUN" 2>/dev/null && break
            sleep 0.1
        done
        [ "$(enter "$i" hostname 2>/dev/null)" = "$n" ] || die "node $n: its namespaces did not come up"
    fi
    if ! alive "$RUN/slurmd-$n.pid"; then
        enter "$i" /usr/sbin/slurmd -f "$CONF" -N "$n" || die "slurmd of $n did not start (see $LOG/slurmd-$n.log)"
    fi
}

kill_node() {  # every process in node I's network namespace, until none is left
    local i=$1 n pids; n=$(node "$i")
    [ -e "/run/netns/$n" ] || return 0
    for _ in $(seq 100); do
        pids=$(ip netns pids "$n" 2>/dev/null)
        [ -z "$pids" ] && break
        kill -9 $pids 2>/dev/null
        sleep 0.05
    done
    [ -z "$(ip netns pids "$n" 2>/dev/null)" ] || die "node $n: processes survive SIGKILL: $(ip netns pids "$n" | tr '\n' ' ')"
    rm -f "$RUN/$n.holder" "$RUN/slurmd-$n.pid"
    [ "${2:-}" = quiet ] || echo "cluster: $n killed"
}

munge_up() {
    if [ ! -s /etc/munge/munge.key ]; then
        (command -v mungekey >/dev/null && mungekey -c -f) || \
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    fi
    mkdir -p /run/munge
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged || die "munged did not start"
    fi
    munge -n | unmunge >/dev/null 2>&1 || die "munge does not work (munge -n | unmunge)"
}

start() {
    [ "$(id -u)" -eq 0 ] || die "not root: the cluster in a box needs root (namespaces, a bridge, slurmd)"
    for t in ip nsenter unshare; do command -v $t >/dev/null || die "no $t"; done
    mkdir -p "$RUN" "$LOG" "$CONF_DIR" /var/spool/slurmctld-box
    install_pkgs
    munge_up
    local changed=0
    write_conf || changed=1
    if [ "$changed" -eq 1 ] && alive "$RUN/slurmctld.pid"; then
        for i in $(seq "$N"); do kill_node "$i" quiet; done
        stop_ctld
    fi
    if ! alive "$RUN/slurmctld.pid"; then
        /usr/sbin/slurmctld -f "$CONF" || die "slurmctld did not start (see $LOG/slurmctld.log)"
    fi
    for i in $(seq "$N"); do node_up "$i"; done
    local names; names=$(for i in $(seq "$N"); do node "$i"; done | paste -sd,)
    local states=""
    for _ in $(seq 90); do
        states=$(sinfo -h -N -n "$names" -o "%N %T" 2>/dev/null | sort -u)
        local ok=1
        while read -r name state; do
            case "$state" in
                idle*|mixed*|allocated*) ;;
                down*|drain*) ok=0; scontrol update nodename="$name" state=resume >/dev/null 2>&1 ;;
                *) ok=0 ;;
            esac
        done <<<"$states"
        [ "$(wc -l <<<"$states")" -eq "$N" ] && [ "$ok" -eq 1 ] && break
        sleep 1
    done
    [ "$ok" -eq 1 ] || die "nodes not idle: $(tr '\n' ' ' <<<"$states") (see $LOG/)"
    local seen
    # (srun's own words, "queued and waiting for resources" while a finished job's nodes are
    # released, go to stderr: only the names on stdout are compared)
    # (a node whose slurmd just started may refuse the first step, "Communication connection
    # failure": asked again, 3 times at most)
    for _ in 1 2 3; do
        seen=$(cd / && timeout 60 srun -N "$N" -n "$N" -t 1 hostname 2>"$RUN/srun-check.err" \
            | sort -u | paste -sd,)
        [ "$seen" = "$names" ] && break
        sleep 3
    done
    [ "$seen" = "$names" ] \
        || die "srun -N $N hostname printed '$seen', not '$names' ($(tail -3 "$RUN/srun-check.err" | paste -sd' '))"
    echo "cluster: up ($N nodes $names on $BR $NET.0/24, SLURM_CONF=$CONF)"
}

stop_ctld() {
    if alive "$RUN/slurmctld.pid"; then
        local pid; pid=$(cat "$RUN/slurmctld.pid"); kill "$pid"
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$RUN/slurmctld.pid"
}

stop() {
    [ "$(id -u)" -eq 0 ] || die "not root"
    if alive "$RUN/slurmctld.pid"; then scancel --quiet --user=root 2>/dev/null || true; fi
    for i in $(seq "$N"); do
        kill_node "$i" quiet
        ip link del "$(port "$i")" 2>/dev/null
        ip netns del "$(node "$i")" 2>/dev/null
    done
    ip link del "$BR" 2>/dev/null
    stop_ctld
    # munged: shared with .ci/slurm.sh's Slurm; stopped only when that one is not running
    if ! alive /run/durable-dispatch-slurm/slurmctld.pid && alive /run/munge/munged.pid; then
        kill "$(cat /run/munge/munged.pid)"
    fi
    echo "cluster: stopped"
}

status() {
    if alive "$RUN/slurmctld.pid"; then echo "slurmctld: running ($(cat "$RUN/slurmctld.pid"))"; else echo "slurmctld: not running"; fi
    for i in $(seq "$N"); do
        local n link="no link" up="dead"; n=$(node "$i")
        if ip link show "$(port "$i")" >/dev/null 2>&1; then
            if ip link show "$(port "$i")" | grep "master $BR" >/dev/null; then link="linked"; else link="CUT"; fi
        fi
        holder_alive "$i" && up="up (holder $(holder "$i"), $(ip netns pids "$n" | wc -l) processes)"
        alive "$RUN/slurmd-$n.pid" && up="$up, slurmd $(cat "$RUN/slurmd-$n.pid")"
        echo "$n $(addr "$i"): $up; $link"
    done
    alive "$RUN/slurmctld.pid" && sinfo -N -o "%N %T %E" 2>/dev/null
}

agent() {  # the launch agent: [ssh options] HOST CMD...: runs CMD (a shell line) in HOST
    while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
    local host=${1:-} i
    [ -n "$host" ] || die "agent: no host"
    shift
    for i in $(seq "$N"); do
        if [ "$host" = "$(node "$i")" ] || [ "$host" = "$(addr "$i")" ]; then
            holder_alive "$i" || die "agent: node $host is down"
            # a login shell's environment, not the launcher's (as ssh gives)
            exec nsenter --target "$(holder "$i")" --net --uts --mount -- \
                env -i PATH="$PATH" HOME="${HOME:-/root}" LANG=C.UTF-8 \
                OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                /bin/sh -c "$*"
        fi
    done
    die "agent: no node '$host' (ddnode1..ddnode$N)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    kill-node) check_index "${2:-}"; kill_node "$2" ;;
    cut) check_index "${2:-}"; ip link set "$(port "$2")" nomaster && echo "cluster: $(node "$2") cut" ;;
    heal) check_index "${2:-}"; ip link set "$(port "$2")" master "$BR" && ip link set "$(port "$2")" up && echo "cluster: $(node "$2") healed" ;;
    agent) shift; agent "$@" ;;
    *) echo "usage: $0 start|stop|status|kill-node I|cut I|heal I|agent HOST CMD..." >&2; exit 2 ;;
esac
