#!/bin/bash
# force-rollup.sh 24.11|26.05 [SHIFT_HOURS=1] [FROM]   ../force-rollup.sh, inside that lab.
# Make the lab's slurmdbd roll up the current, still-open hour so that sreport has data now:
# restart it once under the chroot's libfaketime (+SHIFT h +60 s), wait for its startup rollup,
# stop it, reset lab_last_ran_table to the real current hour, start slurmdbd normally.
# FROM (a date(1) time): also recompute every hour since FROM (see ../force-rollup.sh).
# sreport must then run under the same clock shift (inlab.sh with SLURMTEL_LAB_FAKETIME=+61m):
# it clamps end= to the start of the client's current hour.
# Adapted from ../shared/slurm-lab-newer/force-rollup.sh (which found that the trick works
# unchanged with 24.11/26.05) and ../force-rollup.sh (FROM, waiting for last_ran).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lab.sh" "${1:?usage: force-rollup.sh 24.11|26.05 [SHIFT_HOURS] [FROM]}"
SHIFT=${2:-1}
FROM=${3:-}
CLUSTER=lab
T0=$(date +%s)
log() { echo "[rollup $SUITE $(( $(date +%s) - T0 ))s] $*"; }
[ "$(id -u)" = 0 ] || die "run as root"
[ -e "$ROOT$FTLIB" ] || die "libfaketime missing in $ROOT"
PIDF=$ROOT/run/slurm/slurmdbd.pid
stop_dbd() {
  local pid; pid=$(cat "$PIDF" 2>/dev/null || true)
  ours "$pid" slurmdbd || return 0
  kill -TERM "$pid"
  for ((i = 0; i < 240; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  [ ! -d "/proc/$pid" ] || die "slurmdbd ($pid) did not stop"
  rm -f "$PIDF"
}
wait_dbd() { for ((i = 0; i < 240; i++)); do L sacctmgr -n show cluster >/dev/null 2>&1 && return 0; sleep 0.25; done; die "slurmdbd does not answer"; }
sqlq() { L mariadb -uroot -N slurm_acct_db -e "$1"; }
LOG=$ROOT/var/log/slurm/slurmdbd.log

now=$(date +%s)
hour_now=$(( now / 3600 * 3600 ))
log "last_ran before: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
stop_dbd
if [ -n "$FROM" ]; then
  # move last_ran back (never forward) to the hour/day/month that holds FROM (in the lab's
  # own zone: slurmdbd cuts days and months in local time, and `date` runs inside the lab)
  f=$(L date -d "$FROM" +%s) || die "bad FROM: $FROM"
  fh=$(L date -d "$(L date -d "@$f" +'%Y-%m-%d %H:00:00')" +%s)
  fd=$(L date -d "$(L date -d "@$f" +'%Y-%m-%d 00:00:00')" +%s)
  fm=$(L date -d "$(L date -d "@$f" +'%Y-%m-01 00:00:00')" +%s)
  sqlq "update ${CLUSTER}_last_ran_table set hourly_rollup=least(hourly_rollup,$fh),
        daily_rollup=least(daily_rollup,$fd), monthly_rollup=least(monthly_rollup,$fm)"
  log "recomputing from $FROM: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
fi
lines_before=$(wc -l < "$LOG")
# NB: LD_PRELOAD inside the chroot (its own libfaketime), never the `faketime` wrapper binary:
# it never returns once slurmdbd daemonizes
LAB_ENV="LD_PRELOAD=$FTLIB FAKETIME=+$((SHIFT * 3600 + 60))s" L /usr/sbin/slurmdbd
wait_dbd
# the startup rollup runs in its own thread and writes last_ran when it is done
rolled=0
for ((i = 0; i < 120; i++)); do
  h=$(sqlq "select hourly_rollup from ${CLUSTER}_last_ran_table" 2>/dev/null || echo 0)
  if [ "${h:-0}" -gt "$hour_now" ]; then rolled=1; break; fi
  sleep 0.25
done
[ $rolled = 1 ] || die "the faked startup rollup did not run (hourly_rollup=$h)"
log "last_ran after fake run: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
stop_dbd
tail -n +"$((lines_before + 1))" "$LOG" | grep -i rollup || true
# reset to the real clock so later real rollups recompute the current hour/day/month
now=$(date +%s)
h=$(L date -d "$(L date -d "@$now" +'%Y-%m-%d %H:00:00')" +%s)
d=$(L date -d "$(L date -d "@$now" +'%Y-%m-%d 00:00:00')" +%s)
m=$(L date -d "$(L date -d "@$now" +'%Y-%m-01 00:00:00')" +%s)
sqlq "update ${CLUSTER}_last_ran_table set hourly_rollup=$h, daily_rollup=$d, monthly_rollup=$m"
L /usr/sbin/slurmdbd
wait_dbd
log "done; last_ran reset to: $(sqlq "select hourly_rollup,daily_rollup,monthly_rollup from ${CLUSTER}_last_ran_table")"
