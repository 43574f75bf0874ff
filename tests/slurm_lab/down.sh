#!/bin/bash
# Stop the lab started by up.sh, strictly by pidfile (never by process name).
#   down.sh           stop daemons, keep state (jobs, accounting DB)
#   down.sh --purge   also wipe slurmctld state, slurmd spool, logs and the slurm_acct_db database
#                     (next up.sh starts from JobId=1 with an empty accounting DB)
# Adapted from ../shared/slurm-lab (see README.md here).
set -uo pipefail
PURGE=0; [ "${1:-}" = "--purge" ] && PURGE=1
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
# Never touch a Slurm that is not a lab: an existing /etc/slurm/slurm.conf must be one that
# up.sh (or ../shared/slurm-lab) wrote, else this is a real cluster's head node.
if [ -e /etc/slurm/slurm.conf ] && ! grep -qE '^# slurmtel (integration )?lab' /etc/slurm/slurm.conf; then
  echo "refusing: /etc/slurm/slurm.conf is not a slurmtel lab config (a real Slurm lives here)" >&2; exit 2
fi
NODES=(gpu01 gpu02)

stop() { # stop PIDFILE COMM
  local f=$1 comm=$2 pid
  [ -s "$f" ] || { echo "[down] $comm: no pidfile $f"; return 0; }
  pid=$(cat "$f")
  # a pid whose comm does not match was reused by something else: never signal it
  if [ -z "$pid" ] || [ ! -d "/proc/$pid" ] || [ "$(cat /proc/$pid/comm 2>/dev/null)" != "$comm" ]; then
    echo "[down] $comm: stale pidfile ($pid)"; rm -f "$f"; return 0
  fi
  kill -TERM "$pid"
  for ((i = 0; i < 120; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  if [ -d "/proc/$pid" ]; then echo "[down] $comm ($pid) did not exit, SIGKILL"; kill -KILL "$pid"; fi
  rm -f "$f"
  echo "[down] stopped $comm ($pid)"
}

# the slurmd's and slurmctld stop in parallel (each takes 1-3 s); slurmdbd after them, so that
# slurmctld can hand it its last records, and munged last, since all of them authenticate with it
stop /run/slurm/slurmrestd.pid slurmrestd &
for n in "${NODES[@]}"; do stop "/run/slurm/slurmd-$n.pid" slurmd & done
stop /run/slurm/slurmctld.pid slurmctld &
wait
stop /run/slurm/slurmdbd.pid slurmdbd

if [ $PURGE = 1 ] && [ -S /run/mysqld/mysqld.sock ]; then
  mariadb -uroot -e 'DROP DATABASE IF EXISTS slurm_acct_db' && echo "[down] dropped slurm_acct_db"
fi
# only the MariaDB that up.sh started itself; a pre-started one keeps running
if [ -e /run/slurm-lab-started-mariadb ]; then stop /run/mysqld/mysqld.pid mariadbd; rm -f /run/slurm-lab-started-mariadb; fi
stop /run/munge/munged.pid munged

if [ $PURGE = 1 ]; then
  rm -rf /var/spool/slurm/ctld/* /var/log/slurm/*.log
  for n in "${NODES[@]}"; do rm -rf "/var/spool/slurm/d-$n"/*; done
  echo "[down] purged slurm state and logs"
fi
exit 0
