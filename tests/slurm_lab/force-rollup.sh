#!/bin/bash
# Force slurmdbd to roll up usage for the CURRENT (still open) hour so that sreport shows
# data right after a test run, instead of waiting for the top of the next hour.
#
# slurmdbd only rolls up complete hours (hourly rollup thread, based on time(NULL)), and there
# is no command that forces a rollup.
# Trick: restart slurmdbd once under libfaketime (Debian package "libfaketime") shifted
# +SHIFT hours, let it run its startup rollup, stop it, reset <cluster>_last_ran_table
# to the real current hour (so the normal rollup later recomputes the current hour with
# complete data), then start slurmdbd normally again.
#   usage: force-rollup.sh [SHIFT_HOURS=1] [FROM]
#   FROM (a date(1) time, e.g. 2026-12-02T17:43:33Z): also recompute the hours since FROM. A job
#   that started or ended within a second of a top of the hour may reach slurmdbd after that
#   hour's regular rollup ran; recomputing makes the rolled-up hours match the job records.
# Caveat: hours between now and now+SHIFT are rolled up as "empty so far" for that
# one pass; they are recomputed by the normal rollup thanks to the last_ran reset.
# sreport also clamps end= to the start of the client's current hour: query it under the same
# LD_PRELOAD/FAKETIME (printed at the end) so the open hour is not cut off.
# Adapted from ../shared/slurm-lab (see README.md here).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SHIFT=${1:-1}
FROM=${2:-}
CLUSTER=lab
T0=$(date +%s)
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
# Never touch a Slurm that is not a lab: an existing /etc/slurm/slurm.conf must be one that
# up.sh (or ../shared/slurm-lab) wrote, else this is a real cluster's head node.
if [ -e /etc/slurm/slurm.conf ] && ! grep -qE '^# slurmtel (integration )?lab' /etc/slurm/slurm.conf; then
  echo "refusing: /etc/slurm/slurm.conf is not a slurmtel lab config (a real Slurm lives here)" >&2; exit 2
fi
ftlib() { ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -1; }   # multiarch dir
[ -n "$(ftlib)" ] || "$HERE/../../scripts/ci-slurm-deps.sh"
FTLIB=$(ftlib)
[ -n "$FTLIB" ] || { echo "[rollup] ERROR: libfaketime.so.1 missing" >&2; exit 1; }

log() { echo "[rollup $(( $(date +%s) - T0 ))s] $*"; }
stop_dbd() {
  local pid
  pid=$(cat /run/slurm/slurmdbd.pid 2>/dev/null || true)
  [ -n "$pid" ] && [ "$(cat /proc/$pid/comm 2>/dev/null)" = slurmdbd ] || return 0
  kill -TERM "$pid"
  for ((i = 0; i < 240; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  [ ! -d "/proc/$pid" ] || { echo "[rollup] ERROR: slurmdbd ($pid) did not stop" >&2; exit 1; }
  rm -f /run/slurm/slurmdbd.pid
}
wait_dbd() {
  for ((i = 0; i < 240; i++)); do sacctmgr -n show cluster >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "[rollup] ERROR: slurmdbd does not answer" >&2; exit 1
}
sqlq() { mariadb -uroot -N slurm_acct_db -e "$1"; }

now=$(date +%s)
hour_now=$(( now / 3600 * 3600 ))
log "last_ran before: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
stop_dbd
if [ -n "$FROM" ]; then
  # move last_ran back (never forward) to the hour/day/month that holds FROM (local time, as
  # slurmdbd cuts days and months in its own zone)
  f=$(date -d "$FROM" +%s) || { echo "[rollup] ERROR: bad FROM: $FROM" >&2; exit 1; }
  fh=$(date -d "$(date -d "@$f" +'%Y-%m-%d %H:00:00')" +%s)
  fd=$(date -d "$(date -d "@$f" +'%Y-%m-%d 00:00:00')" +%s)
  fm=$(date -d "$(date -d "@$f" +'%Y-%m-01 00:00:00')" +%s)
  sqlq "update ${CLUSTER}_last_ran_table set hourly_rollup=least(hourly_rollup,$fh),
        daily_rollup=least(daily_rollup,$fd), monthly_rollup=least(monthly_rollup,$fm)"
  log "recomputing from $FROM: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
fi
lines_before=$(wc -l < /var/log/slurm/slurmdbd.log)
# rollup of hour H happens when the (fake) clock is past H+1:00.
# NB: do not use the `faketime` wrapper binary here: it never returns once slurmdbd daemonizes.
LD_PRELOAD=$FTLIB FAKETIME="+$((SHIFT * 3600 + 60))s" /usr/sbin/slurmdbd
wait_dbd
# The startup rollup runs in its own thread and writes last_ran when it is done (< 1 s on a small
# DB): wait for that instead of a fixed sleep.
rolled=0
for ((i = 0; i < 120; i++)); do
  h=$(sqlq "select hourly_rollup from ${CLUSTER}_last_ran_table" 2>/dev/null || echo 0)
  if [ "${h:-0}" -gt "$hour_now" ]; then rolled=1; break; fi
  sleep 0.25
done
[ $rolled = 1 ] || { echo "[rollup] ERROR: the faked startup rollup did not run (hourly_rollup=$h)" >&2; exit 1; }
log "last_ran after fake run: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
stop_dbd
tail -n +"$((lines_before + 1))" /var/log/slurm/slurmdbd.log | grep -i rollup || true
# reset to the real clock so later real rollups recompute the current hour/day/month
now=$(date +%s)
h=$(date -d "$(date -d "@$now" +'%Y-%m-%d %H:00:00')" +%s)
d=$(date -d "$(date -d "@$now" +'%Y-%m-%d 00:00:00')" +%s)
m=$(date -d "$(date -d "@$now" +'%Y-%m-01 00:00:00')" +%s)
sqlq "update ${CLUSTER}_last_ran_table set hourly_rollup=$h, daily_rollup=$d, monthly_rollup=$m"
/usr/sbin/slurmdbd
wait_dbd
log "done; last_ran reset to: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
echo "[rollup] sreport truncates end= to the client's current hour; to see the still-open hour run it as:"
echo "  LD_PRELOAD=$FTLIB FAKETIME=+$((SHIFT * 60 + 1))m sreport -P -T gres/gpu cluster Utilization start=... end=..."
