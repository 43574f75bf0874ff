#!/bin/bash
# down.sh 24.11|26.05 [--purge]  stop that lab strictly by pidfile.
# A pid is only signalled when its comm matches AND its root is the lab chroot (/srv/slurmtel-SUITE),
# so no host process (e.g. the host's Slurm 22.05 lab) can ever be hit.
#   --purge  also drops slurm_acct_db and wipes ctld state, slurmd spool and slurm logs
#            (the next up.sh starts from JobId=1 with an empty accounting DB)
# The chroot itself is kept for reuse. Leftover job processes (slurmstepd, job scripts) that are
# inside the lab's netns AND chroot are terminated too (they were started by the lab).
# Adapted from ../shared/slurm-lab-newer/down.sh; like ../down.sh it stops the slurmd's and
# slurmctld in parallel, then slurmdbd, then MariaDB and munged.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lab.sh" "${1:?usage: down.sh 24.11|26.05 [--purge]}"
PURGE=0; [ "${2:-}" = "--purge" ] && PURGE=1
[ "$(id -u)" = 0 ] || die "run as root"
[ -d "$ROOT" ] || { echo "[down $SUITE] no chroot $ROOT: nothing to stop"; exit 0; }

stop() { # stop PIDFILE(host path) COMM
  local f=$1 comm=$2 pid
  [ -s "$f" ] || { echo "[down $SUITE] $comm: no pidfile"; return 0; }
  pid=$(cat "$f")
  if ! ours "$pid" "$comm"; then echo "[down $SUITE] $comm: stale pidfile ($pid)"; rm -f "$f"; return 0; fi
  kill -TERM "$pid"
  for ((i = 0; i < 120; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  if [ -d "/proc/$pid" ] && ours "$pid" "$comm"; then echo "[down $SUITE] $comm ($pid) did not exit, SIGKILL"; kill -KILL "$pid"; fi
  rm -f "$f"; echo "[down $SUITE] stopped $comm ($pid)"
}

for n in "${NODES[@]}"; do stop "$ROOT/run/slurm/slurmd-$n.pid" slurmd & done
stop "$ROOT/run/slurm/slurmctld.pid" slurmctld &
wait
stop "$ROOT/run/slurm/slurmdbd.pid" slurmdbd
if [ $PURGE = 1 ] && holder_alive && pid_alive "$ROOT/run/mysqld/mysqld.pid" mariadbd; then
  L mariadb -uroot -e 'DROP DATABASE IF EXISTS slurm_acct_db' && echo "[down $SUITE] dropped slurm_acct_db"
fi
stop "$ROOT/run/mysqld/mysqld.pid" mariadbd
stop "$ROOT/run/munge/munged.pid" munged
if [ $PURGE = 1 ] && [ -d "$ROOT/var/lib/mysql/slurm_acct_db" -o -d "$ROOT/var/lib/mariadb/slurm_acct_db" ]; then
  # MariaDB was not running (a lab killed earlier): its datadir still holds the old jobs.
  # The server is stopped, so drop the schema's files; up.sh creates the database again.
  rm -rf "$ROOT/var/lib/mysql/slurm_acct_db" "$ROOT/var/lib/mariadb/slurm_acct_db"
  echo "[down $SUITE] removed the stopped server's slurm_acct_db files"
fi
# leftovers inside OUR netns and chroot (slurmstepd, job scripts); never anything else
if ip netns list | grep -qw "^$NS"; then
  for sig in TERM KILL; do
    for pid in $(ip netns pids "$NS" 2>/dev/null); do
      [ "$pid" = "$(cat "$HOLDER_PIDFILE" 2>/dev/null)" ] && continue
      [ "$(readlink /proc/$pid/root 2>/dev/null)" = "$ROOT" ] || continue
      echo "[down $SUITE] leftover in lab: $pid $(cat /proc/$pid/comm 2>/dev/null) -> $sig"; kill -"$sig" "$pid" 2>/dev/null
    done
    [ $sig = TERM ] && sleep 1
  done
fi
if [ $PURGE = 1 ]; then
  rm -rf "$ROOT"/var/spool/slurm/ctld/* "$ROOT"/var/log/slurm/*.log
  for n in "${NODES[@]}"; do rm -rf "$ROOT/var/spool/slurm/d-$n"/*; done
  echo "[down $SUITE] purged slurm state and logs"
fi
stop "$HOLDER_PIDFILE" sleep     # the namespace holder; its mounts vanish with the namespace
if ip netns list | grep -qw "^$NS"; then
  if [ -z "$(ip netns pids "$NS" 2>/dev/null)" ]; then ip netns del "$NS" && echo "[down $SUITE] deleted netns $NS"
  else echo "[down $SUITE] netns $NS still has pids: $(ip netns pids "$NS" | tr '\n' ' ')"; fi
fi
exit 0
