#!/bin/bash
# sovia-bed stage 2: runs inside the guest, chrooted into the host's root fs
# (9p). Loads the RDMA modules, brings up rxe, waits for the peer (two-hosts
# mode), runs the user's command and records its exit status in the run dir.
#
# usage: stage2.sh RUN_DIR ROLE KERNEL_ROOT
# Files in RUN_DIR (written by sovia-bed on the host):
#   conf      bash assignments: BED_MODE BED_CWD BED_ROLES BED_BARRIER_TIMEOUT
#   argv      the command, NUL-separated
#   env       the caller's environment, NUL-separated NAME=VALUE
# Files written here (per role):
#   out.ROLE err.ROLE   command stdout/stderr (appended; pre-created by host)
#   ready.ROLE          rxe is up
#   rc.ROLE             exit status of the command
#   bedfail.ROLE        the bed itself failed (reason inside)
set -u
RUN=$1 ROLE=$2 KROOT=$3
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C

log() { echo "sovia-bed-guest[$ROLE]: $*" >&2; }
bedfail() {
    log "FATAL: $*"
    echo "$*" >> "$RUN/bedfail.$ROLE"
    sync
    exit 125
}

# shellcheck source=/dev/null
. "$RUN/conf" || bedfail "cannot read $RUN/conf"

mp() { modprobe -d "$KROOT" "$@"; }

t0=$(date +%s%N)
# One modprobe and one ip call: every exec over 9p costs ~0.2 s under
# emulation. crc32_generic comes first: rdma_rxe asks the crypto layer for
# "crc32" and fails with "failed to init crc32 algorithm" if nothing has it.
MODS=(crc32_generic rdma_rxe ib_uverbs rdma_ucm)
case "$BED_MODE" in
    guest) MODS+=(veth) ;;
    two-hosts) MODS+=(virtio_net) ;;
esac
mp -a "${MODS[@]}" || bedfail "modprobe -d $KROOT -a ${MODS[*]} failed"

DEV=rxe0
case "$BED_MODE" in
guest)
    # Both ends of CMD run in this (root) namespace and talk to $IP: rxe
    # loops packets for its own address back internally.
    # An IPv6 address too: RoCEv2 carries IPv6 GIDs, and dual-stack and
    # IPv6 servers are tested here (nodad: usable at once).
    NETDEV=veth0 IP=10.77.0.1 PEER_IP='' IP6=fd77::1 PEER_IP6=''
    printf '%s\n' "link set lo up" "link add veth0 type veth peer name veth1" \
        "addr add $IP/24 dev veth0" "addr add $IP6/64 dev veth0 nodad" \
        "link set veth1 up" "link set veth0 up" \
        | ip -batch - || bedfail "cannot set up lo and the veth pair"
    ;;
two-hosts)
    NETDEV=''
    for _ in $(seq 50); do
        for n in /sys/class/net/*; do
            [[ -r $n/device/uevent && $(<"$n/device/uevent") == *DRIVER=virtio_net* ]] \
                && NETDEV=${n##*/} && break
        done
        [ -n "$NETDEV" ] && break
        sleep 0.1
    done
    [ -n "$NETDEV" ] || bedfail "no virtio-net interface appeared"
    case "$ROLE" in
        a) IP=10.77.0.1 PEER_IP=10.77.0.2 IP6=fd77::1 PEER_IP6=fd77::2 ;;
        b) IP=10.77.0.2 PEER_IP=10.77.0.1 IP6=fd77::2 PEER_IP6=fd77::1 ;;
        *) bedfail "bad role $ROLE" ;;
    esac
    printf '%s\n' "link set lo up" "addr add $IP/24 dev $NETDEV" \
        "addr add $IP6/64 dev $NETDEV nodad" "link set $NETDEV up" \
        | ip -batch - || bedfail "cannot configure lo and $NETDEV"
    ;;
*) bedfail "bad mode $BED_MODE" ;;
esac

rdma link add "$DEV" type rxe netdev "$NETDEV" || bedfail "rdma link add $DEV type rxe netdev $NETDEV failed"
state=''
for _ in $(seq 100); do
    read -r state 2>/dev/null < "/sys/class/infiniband/$DEV/ports/1/state" || state=''

    case "$state" in *ACTIVE*) break ;; esac
    sleep 0.1
done
case "$state" in *ACTIVE*) ;; *) bedfail "$DEV port not ACTIVE (state: ${state:-none})" ;; esac
log "$DEV up on $NETDEV ($IP) after $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# Readiness + start barrier: every guest waits until all roles are ready.
: > "$RUN/ready.$ROLE"
sync
deadline=$(( $(date +%s) + BED_BARRIER_TIMEOUT ))
for r in $BED_ROLES; do
    while [ ! -e "$RUN/ready.$r" ]; do
        [ -e "$RUN/bedfail.$r" ] && bedfail "peer $r failed to set up"
        [ "$(date +%s)" -lt "$deadline" ] || bedfail "peer $r not ready after ${BED_BARRIER_TIMEOUT}s"
        sleep 0.2
    done
done

mapfile -d '' -t ARGV < "$RUN/argv"
mapfile -d '' -t ENVV < "$RUN/env"
[ "${#ARGV[@]}" -gt 0 ] || bedfail "empty command"
cd -- "$BED_CWD" || bedfail "cannot cd to $BED_CWD inside the guest"

# Guest-local tmpfs dir: AF_UNIX sockets and FIFOs do not work on 9p paths.
mkdir -p /dev/shm/sovia-bed && chmod 1777 /dev/shm/sovia-bed

BEDVARS=(
    "PWD=$BED_CWD"
    "SOVIA_BED_TMP=/dev/shm/sovia-bed"
    "SOVIA_BED_DEV=$DEV"
    "SOVIA_BED_NETDEV=$NETDEV"
    "SOVIA_BED_IP=$IP"
    "SOVIA_BED_IP6=$IP6"
    "SOVIA_BED_MODE=$BED_MODE"
    "SOVIA_BED_BARRIER=$BED_BARRIER"
    "SOVIA_BED_BARRIER_DIR=$RUN/barrier"
    "SOVIA_BED_ROLES=$BED_ROLES"
)
if [ "$BED_MODE" = two-hosts ]; then
    BEDVARS+=("SOVIA_BED_ROLE=$ROLE" "SOVIA_BED_PEER_IP=$PEER_IP"
        "SOVIA_BED_PEER_IP6=$PEER_IP6")
fi

env -i "${ENVV[@]}" "${BEDVARS[@]}" "${ARGV[@]}" \
    </dev/null >>"$RUN/out.$ROLE" 2>>"$RUN/err.$ROLE"
rc=$?
echo "$rc" > "$RUN/rc.$ROLE.tmp" && mv "$RUN/rc.$ROLE.tmp" "$RUN/rc.$ROLE"
sync
exit 0
