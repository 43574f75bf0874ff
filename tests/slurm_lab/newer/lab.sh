# lab.sh - sourced by the scripts here. One lab per Debian suite:
#   trixie -> Slurm 24.11, sid -> Slurm 26.05 (the versions those suites ship)
# chroot /srv/slurmtel-<suite> (debootstrap minbase + the lab packages, built by build-chroot.sh),
# network namespace slurmtel-<suite>, its own UTS namespace with hostname "slurmnew". A "holder"
# process (sleep infinity, chrooted) owns the mount+uts namespaces; every command enters them with
# nsenter -t <holder>. Nothing here touches the host's /etc, /run, ports or its Slurm 22.05 lab.
# Adapted from ../shared/slurm-lab-newer/lab.sh (the recipe proven on this machine); the names
# (/srv/slurmtel-*, netns slurmtel-*) are the project's own so the two never share a chroot.
lab_suite() { # lab_suite SUITE|VERSION -> sets SUITE and the lab's ClusterID (see up.sh)
  case "$1" in
    trixie|24.11) SUITE=trixie; CLUSTER_ID=${SLURMTEL_LAB_CLUSTER_ID:-1000} ;;
    sid|26.05) SUITE=sid; CLUSTER_ID=${SLURMTEL_LAB_CLUSTER_ID:-3000} ;;
    *) echo "unknown lab '$1' (trixie|24.11 or sid|26.05)" >&2; exit 2 ;;
  esac
}
lab_suite "${1:-${SUITE:-}}"
ROOT=${SLURMTEL_CHROOT_DIR:-/srv}/slurmtel-$SUITE
NS=slurmtel-$SUITE
LABHOST=slurmnew
HOLDER_PIDFILE=$ROOT/run/newslurm/holder.pid
NODES=(gpu01 gpu02)
FTLIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1   # path inside the chroot
# build-chroot.sh writes this last: a chroot without it is incomplete and is rebuilt
READY=$ROOT/.slurmtel-chroot-ready

die() { echo "[$SUITE] ERROR: $*" >&2; exit 1; }

# ours PID COMM -> 0 if PID is alive, has COMM, and is chrooted into $ROOT (never a host process)
ours() {
  local pid=$1 comm=$2
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(cat /proc/$pid/comm 2>/dev/null)" = "$comm" ] || return 1
  [ "$(readlink /proc/$pid/root 2>/dev/null)" = "$ROOT" ]
}
# pid_alive PIDFILE(host path) COMM
pid_alive() { [ -s "$1" ] && ours "$(cat "$1" 2>/dev/null)" "$2"; }

holder_alive() { pid_alive "$HOLDER_PIDFILE" sleep; }

# L CMD... : run CMD inside the lab (netns + mount ns + uts ns + chroot) with a clean
# environment; TZ and SLURM_TIME_FORMAT pass through when set (the clients read them), LAB_ENV
# adds VAR=VALUE words, LAB_EXEC=exec replaces the calling shell (its exit status is CMD's)
L() {
  holder_alive || die "lab holder not running (run up.sh first)"
  local pass=()
  [ -n "${TZ:-}" ] && pass+=("TZ=$TZ")
  [ -n "${SLURM_TIME_FORMAT:-}" ] && pass+=("SLURM_TIME_FORMAT=$SLURM_TIME_FORMAT")
  ${LAB_EXEC:-} nsenter -t "$(cat "$HOLDER_PIDFILE")" -n -m -u -r -w \
    /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root TERM=dumb "${pass[@]}" ${LAB_ENV:-} "$@"
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD...
  local t=$1 what=$2; shift 2
  for ((i = 0; i < t * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  die "timed out after ${t}s waiting for: $what"
}
