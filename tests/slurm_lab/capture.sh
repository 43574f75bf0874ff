#!/bin/bash
# capture.sh OUTDIR SACCT_FORMAT [SCENARIO_START SCENARIO_END]   real outputs of this lab's Slurm for the parser fixtures:
# jobs that never started (cancelled while pending, held then cancelled, a pending array, a job
# pending for Resources), jobs that fail at launch, a requeued job caught while its next attempt
# waits, a het job, an empty window; and the controller views while GPU jobs run.
#   OUTDIR/sacct/      sacct --json and -P outputs (+ .stderr and .rc for the empty window)
#   OUTDIR/slurmctld/  squeue --json, squeue -a --json, scontrol show job -d [-o],
#                      scontrol show node -d, sinfo --json, scontrol show config
#   OUTDIR/commands.txt every command, in order, with the time it ran (UTC)
# SACCT_FORMAT: slurmtel's own -P --format list (slurmtel/parsers/sacct_parsable.py SACCT_FIELDS);
# the -P outputs are taken exactly as slurmtel runs sacct: SLURM_TIME_FORMAT=%s, delimiter \x1f.
# SCENARIO_START SCENARIO_END (scenario.sh's window.txt): also capture sacct of that scenario.
# Runs on a lab brought up by up.sh (../newer/run-in-lab.sh runs it inside a newer lab) whose
# queue is empty; takes about 45 s. Used by hand to (re)make tests/fixtures/*/slurm-*/.
set -uo pipefail
OUT=${1:?usage: capture.sh OUTDIR SACCT_FORMAT}
FMT=${2:?usage: capture.sh OUTDIR SACCT_FORMAT}
export TZ=UTC
unset SLURM_TIME_FORMAT
mkdir -p "$OUT/sacct" "$OUT/slurmctld"
T0=$(date +%s)
CMDS="$OUT/commands.txt"; : > "$CMDS"
log() { echo "[capture $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[capture] ERROR: $*" >&2; squeue -a -o '%i %j %T %R' >&2; exit 1; }
# cap FILE CMD...: stdout to FILE; stderr and the exit status beside it when either is not empty/0
cap() {
  local f=$1; shift
  echo "$(date -u +%Y-%m-%dT%H:%M:%S) $(basename "$f"): $*" >> "$CMDS"
  "$@" > "$f" 2> "$f.stderr"; local rc=$?
  [ -s "$f.stderr" ] || rm -f "$f.stderr"
  if [ $rc != 0 ] || [ -e "$f.stderr" ]; then echo "$rc" > "$f.rc"; fi
  return 0
}
# the exact argv of slurmtel's run_sacct in -P mode
sacct_slurmtel_P() { env SLURM_TIME_FORMAT=%s sacct -a -D -X -S "$1" -E "$2" -P --delimiter=$'\x1f' --format="$FMT"; }
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S; }
state_of() { squeue -h -j "$1" -o %T 2>/dev/null | head -1; }
wait_sacct() { # wait_sacct SECONDS REGEX JOBID: until sacct -X shows a record of JOBID in REGEX
  for ((i = 0; i < $1 * 4; i++)); do
    sacct -n -X -P -j "$3" -o State 2>/dev/null | grep -qE "^($2)" && return 0
    sleep 0.25
  done
  die "sacct does not show $3 in $2 after $1 s (now: $(sacct -n -X -P -j "$3" -o State | tr '\n' ' '))"
}
wait_squeue() { # wait_squeue SECONDS REGEX JOBID...
  local t=$1 re=$2; shift 2
  for j in "$@"; do
    for ((i = 0; i < t * 4; i++)); do state_of "$j" | grep -qE "^($re)$" && continue 2; sleep 0.25; done
    die "job $j not $re after $t s (now: $(state_of "$j"))"
  done
}
sub() { # sub USER SBATCH-ARGS... -- SHELL-COMMAND  -> job id
  local user=$1; shift; local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done; shift
  local id
  id=$(cd "/home/$user" && runuser -u "$user" -- sbatch --parsable -o /dev/null "${args[@]}" --wrap "$*") || die "sbatch ${args[*]} failed"
  echo "$(date -u +%Y-%m-%dT%H:%M:%S) sbatch as $user: ${args[*]} --wrap '$*' -> ${id%%;*}" >> "$CMDS"
  echo "${id%%;*}"
}
[ -z "$(squeue -h -a -o %i)" ] || die "the queue is not empty"
sinfo -V > "$OUT/version.txt"
RELEASE=/tmp/slurmtel-capture-release; rm -f "$RELEASE"; touch "$RELEASE.parent"; rm -f "$RELEASE.parent"
HOLD="while [ ! -e $RELEASE ]; do sleep 0.5; done"
START=$(( $(date +%s) - 1 ))
scontrol update nodename=gpu[01-02] state=resume >/dev/null 2>&1 || true

cap "$OUT/sacct/sacct-empty-window.json" sacct -a -D -X -S 2020-01-01T00:00:00 -E 2020-01-01T01:00:00 --json
cap "$OUT/sacct/sacct-empty-window-slurmtel-P.psv" sacct_slurmtel_P 2020-01-01T00:00:00 2020-01-01T01:00:00
cap "$OUT/slurmctld/squeue-a-empty.json" squeue -a --json

# ---------------------------------------------------------------- running GPU jobs
log "submitting"
RUN_A=$(sub alice -J run-gpu2 -w gpu01 --gres=gpu:2 -t 5 -- "$HOLD")
RUN_B=$(sub bob -J run-gpu1 -w gpu02 --gres=gpu:1 -t 5 -- "$HOLD")
MULTI=$(sub carol -J run-multinode -N 2 --gpus-per-node=1 -t 5 -- "srun -N2 bash -c '$HOLD'")
ARRAY=$(sub alice -J run-array --array=1-2 --gres=gpu:1 -t 5 -- "$HOLD")
# het job: a GPU component and a CPU-only one (needs a script file; --wrap has no ":")
printf '#!/bin/bash\n#SBATCH -J run-het -t 5 --gres=gpu:1\n#SBATCH hetjob\n#SBATCH -p debug -n 1\n%s\n' "$HOLD" > /home/bob/het.sh
chown bob /home/bob/het.sh
HET=$(cd /home/bob && runuser -u bob -- sbatch --parsable -o /dev/null het.sh) || die "het sbatch failed"
HET=${HET%%;*}; echo "$(date -u +%Y-%m-%dT%H:%M:%S) sbatch as bob: het.sh ($(tr '\n' ' ' < /home/bob/het.sh)) -> $HET" >> "$CMDS"
# requeued later: the first attempt waits, the rerun is short
RQ=$(sub carol -J requeue -p debug --requeue -t 5 -- 'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 300; else sleep 5; fi')
# never started: held, BeginTime in an hour, a pending array, a job waiting for gpu01's GPUs
HELD=$(sub bob -J pend-held --hold --gres=gpu:1 -t 5 -- 'sleep 5')
BEGIN=$(sub carol -J pend-begin --begin=now+3600 --gres=gpu:1 -t 5 -- 'sleep 5')
APEND=$(sub alice -J pend-array --array=1-3%1 --begin=now+3600 --gres=gpu:1 -t 5 -- 'sleep 5')
RES=$(sub bob -J pend-resources -w gpu01 --gres=gpu:4 -t 5 -- 'sleep 5')
# failing at launch: a stdout path that cannot be opened, an interpreter that does not exist
printf '#!/nonexistent/interpreter\necho never\n' > /home/carol/badshell.sh; chown carol /home/carol/badshell.sh
BADSH=$(cd /home/carol && runuser -u carol -- sbatch --parsable -J launch-badshell -p debug -t 2 -o /dev/null badshell.sh) || die "badshell sbatch failed"
echo "$(date -u +%Y-%m-%dT%H:%M:%S) sbatch as carol: badshell.sh (#!/nonexistent/interpreter) -> $BADSH" >> "$CMDS"
BADOUT=$(sub carol -J launch-badout -p debug -t 2 -o /nonexistent/dir/out.txt -- 'echo never')
log "running: $RUN_A $RUN_B $MULTI $ARRAY het=$HET requeue=$RQ; pending: $HELD $BEGIN $APEND $RES; launch: $BADSH $BADOUT"

wait_squeue 60 RUNNING "$RUN_A" "$RUN_B" "$MULTI" "$RQ" "$HET"
for t in 1 2; do wait_squeue 60 RUNNING "${ARRAY}_$t"; done
for j in "$RUN_A" "$RUN_B" "$MULTI" "$RQ" "$HET"; do wait_sacct 30 RUNNING "$j"; done
for j in "$HELD" "$BEGIN" "$APEND" "$RES"; do wait_sacct 30 PENDING "$j"; done
sleep 2   # the srun steps of the multi-node job are in sacct a moment later
log "capturing the controller views"
S=slurmctld
cap "$OUT/$S/squeue-running.json" squeue --json
cap "$OUT/$S/squeue-a-running.json" squeue -a --json
cap "$OUT/$S/scontrol-show-job-d-running.txt" scontrol show job -d
cap "$OUT/$S/scontrol-show-job-d-oneliner-running.txt" scontrol show job -d -o
cap "$OUT/$S/scontrol-show-node-d-running.txt" scontrol show node -d
cap "$OUT/$S/sinfo-running.json" sinfo --json
cap "$OUT/$S/sinfo-N-running.txt" sinfo -N -o '%N %P %T %c %m %G %E'
cap "$OUT/$S/scontrol-show-config.txt" scontrol show config
NOW=$(( $(date +%s) + 1 ))
cap "$OUT/sacct/sacct-a-D-X-running.json" sacct -a -D -X -S "$(iso $START)" -E "$(iso $NOW)" --json
cap "$OUT/sacct/sacct-a-D-running.json" sacct -a -D -S "$(iso $START)" -E "$(iso $NOW)" --json
cap "$OUT/sacct/sacct-a-D-X-running-slurmtel-P.psv" sacct_slurmtel_P "$(iso $START)" "$(iso $NOW)"

# ---------------------------------------------------------------- requeue, cancel while pending
log "requeue $RQ"
scontrol requeue "$RQ" || die "requeue failed"
echo "$(date -u +%Y-%m-%dT%H:%M:%S) scontrol requeue $RQ" >> "$CMDS"
wait_squeue 30 PENDING "$RQ"
# -D: without it sacct -j shows only the last attempt
for ((i = 0; i < 120; i++)); do [ "$(sacct -n -D -X -P -j "$RQ" -o State | wc -l)" -ge 2 ] && break; sleep 0.25; done
NOW=$(( $(date +%s) + 1 ))
cap "$OUT/sacct/sacct-j-requeued-pending.json" sacct -D -X -j "$RQ" --json
cap "$OUT/sacct/sacct-j-requeued-pending-slurmtel-P.psv" env SLURM_TIME_FORMAT=%s sacct -D -X -j "$RQ" -P --delimiter=$'\x1f' --format="$FMT"
cap "$OUT/$S/squeue-j-requeued-pending.json" squeue -j "$RQ" --json
cap "$OUT/$S/scontrol-show-job-d-requeued-pending.txt" scontrol show job -d "$RQ"
log "cancel pending: $HELD $BEGIN $APEND $RES"
scancel "$HELD" "$BEGIN" "$APEND" "$RES"
echo "$(date -u +%Y-%m-%dT%H:%M:%S) scancel $HELD $BEGIN $APEND $RES" >> "$CMDS"
touch "$RELEASE"; echo "$(date -u +%Y-%m-%dT%H:%M:%S) released the running jobs" >> "$CMDS"

for ((i = 0; i < 400; i++)); do [ -z "$(squeue -h -a -o %i)" ] && break; sleep 0.25; done
[ -z "$(squeue -h -a -o %i)" ] || die "jobs still queued"
for ((i = 0; i < 120; i++)); do
  open=$(sacct -a -D -X -n -P -S "$(iso $START)" -o JobIDRaw,State,End | grep -cE '\|(PENDING|RUNNING|COMPLETING)\||\|Unknown$')
  [ "$open" = 0 ] && break; sleep 0.25
done
END=$(( $(date +%s) + 1 )); sleep 1.1
log "final captures over $(iso $START) .. $(iso $END)"
cap "$OUT/sacct/sacct-a-D-X-final.json" sacct -a -D -X -S "$(iso $START)" -E "$(iso $END)" --json
cap "$OUT/sacct/sacct-a-D-final.json" sacct -a -D -S "$(iso $START)" -E "$(iso $END)" --json
cap "$OUT/sacct/sacct-a-D-X-final-slurmtel-P.psv" sacct_slurmtel_P "$(iso $START)" "$(iso $END)"
cap "$OUT/sacct/sacct-a-D-final-P.psv" sacct -a -D -S "$(iso $START)" -E "$(iso $END)" -P --format="$FMT"
# jobs never eligible inside the window (held; BeginTime after it) are left out of a plain -S/-E
# query: sacct only lists them by id, or with -s (a state filter selects by state change time)
NEVER="$HELD,$BEGIN,$APEND,$RES"
cap "$OUT/sacct/sacct-D-X-j-never-started.json" sacct -D -X -j "$NEVER" --json
cap "$OUT/sacct/sacct-D-X-j-never-started-slurmtel-P.psv" env SLURM_TIME_FORMAT=%s sacct -D -X -j "$NEVER" -P --delimiter=$'\x1f' --format="$FMT"
cap "$OUT/sacct/sacct-a-D-X-s-CA-final.json" sacct -a -D -X -s CA -S "$(iso $START)" -E "$(iso $END)" --json
cap "$OUT/sacct/sacct-a-D-X-final.txt" sacct -a -D -X -S "$(iso $START)" -E "$(iso $END)" --format=JobID%14,JobIDRaw,JobName%16,User,Account,Partition,State%14,ExitCode,Start,End,AllocTRES%60,NodeList
cap "$OUT/$S/squeue-a-final.json" squeue -a --json
printf 'run-gpu2\t%s\nrun-gpu1\t%s\nrun-multinode\t%s\nrun-array\t%s\nrun-het\t%s\nrequeue\t%s\npend-held\t%s\npend-begin\t%s\npend-array\t%s\npend-resources\t%s\nlaunch-badshell\t%s\nlaunch-badout\t%s\n' \
  "$RUN_A" "$RUN_B" "$MULTI" "$ARRAY" "$HET" "$RQ" "$HELD" "$BEGIN" "$APEND" "$RES" "$BADSH" "$BADOUT" > "$OUT/jobs.tsv"
echo "$(iso $START) $(iso $END)" > "$OUT/window.txt"
if [ -n "${3:-}" ]; then
  # the integration scenario's jobs (scenario.sh's window.txt), as slurmtel reads them
  SS=$3 SE=${4:?SCENARIO_END missing}
  log "scenario window $SS .. $SE"
  cap "$OUT/sacct/scenario-sacct-a-D-X.json" sacct -a -D -X -S "$SS" -E "$SE" --json
  cap "$OUT/sacct/scenario-sacct-a-D.json" sacct -a -D -S "$SS" -E "$SE" --json
  cap "$OUT/sacct/scenario-sacct-a-D-X-slurmtel-P.psv" sacct_slurmtel_P "$SS" "$SE"
  cap "$OUT/sacct/scenario-sacct-a-D-X.txt" sacct -a -D -X -S "$SS" -E "$SE" --format=JobID%14,JobIDRaw,JobName%18,User,Account,Partition,State%14,ExitCode,Start,End,AllocTRES%60,NodeList
fi
rm -f "$RELEASE" /home/bob/het.sh /home/carol/badshell.sh
log "done ($(cat "$OUT/version.txt"))"
