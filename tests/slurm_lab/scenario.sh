#!/bin/bash
# Run the integration job mix on the lab started by up.sh and write what the tests need:
#   usage: scenario.sh OUTDIR
#   OUTDIR/manifest.json   {"cluster", "window": {"start","end"} (ISO UTC), "cgroup", "task_plugin",
#                           "jobs": [{label, job_id, user, account, expected: [state per attempt],
#                                     gpus, nodes, array_tasks, queue_wait}]}   (written last)
#   OUTDIR/jobs.tsv        the same jobs as a table, OUTDIR/window.txt "START END",
#   OUTDIR/sacct-a-D-X.psv sacct -a -D -X -P over the window (for whoever reads a failure)
#   OUTDIR/snapshots/      squeue-YYYYmmddTHHMMSS.json and nodes-YYYYmmddTHHMMSS.txt (UTC), one
#                          pair a second while jobs run: which GPU indices each job held
#
# The same outcomes as ../shared/slurm-lab/scenario.sh - COMPLETED, FAILED, TIMEOUT, CANCELLED
# (running and pending), REQUEUED, an array, a multi-node job, NODE_FAIL with and without
# requeue, OUT_OF_MEMORY, GPU queue waits - and CPU-only jobs on one and two nodes and --mem
# jobs (every TRES of sreport -T ALL) - in about 70-100 s instead of 170 s: the node
# failure and the requeue run first, on jobs pinned so that nothing else is on gpu02 when it
# "fails", while the TIMEOUT job (the long pole: limit 60 s, enforced by slurmctld's 30 s
# background check, so 60-90 s) runs on gpu01 from the start; the contention phase follows
# on both nodes while it runs.
# Any surprise (a job not in the expected state at a step) stops the script with status 1.
set -uo pipefail
OUT="${1:?usage: scenario.sh OUTDIR}"
mkdir -p "$OUT"
rm -f "$OUT/manifest.json"
T0=$(date +%s)
START_EPOCH=$((T0 - 2))
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%S; }
log() { echo "[scenario $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[scenario $(( $(date +%s) - T0 ))s] ERROR: $*" >&2; squeue -a -o '%i %j %T %R' >&2; exit 1; }
# sacct/squeue print local times otherwise; everything here is UTC
export TZ=UTC

JOBS="$OUT/jobs.tsv"
printf 'label\tjob_id\tuser\taccount\texpected\tgpus\tnodes\tarray_tasks\tqueue_wait\n' > "$JOBS"
declare -A DEFAULT_ACCOUNT=([alice]=physics [bob]=chemistry [carol]=biology)

# sub LABEL USER EXPECTED GPUS NODES ARRAY_TASKS QUEUE_WAIT SBATCH-ARGS... -- SHELL-COMMAND
#   EXPECTED: final state of each attempt, comma-separated (a requeued job has two)
#   GPUS: allocated GPUs per attempt (0 for a job that never starts), NODES: per attempt
#   ARRAY_TASKS: number of array tasks or "-", QUEUE_WAIT: 1 when the job must wait for GPUs
sub() {
  local label=$1 user=$2 expected=$3 gpus=$4 nodes=$5 tasks=$6 qwait=$7; shift 7
  local args=() account id
  while [ "$1" != "--" ]; do args+=("$1"); shift; done; shift
  local cmd="$*"
  account=${DEFAULT_ACCOUNT[$user]}
  for ((i = 0; i < ${#args[@]}; i++)); do [ "${args[$i]}" = -A ] && account=${args[$((i + 1))]}; done
  id=$(cd "/home/$user" && runuser -u "$user" -- sbatch --parsable -J "$label" -o "slurm-%j-%x.out" \
        "${args[@]}" --wrap "echo host=\$(hostname) node=\$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES SLURM_RESTART_COUNT=\${SLURM_RESTART_COUNT:-0}; $cmd") \
    || die "sbatch $label failed"
  id=${id%%;*}
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$id" "$user" "$account" "$expected" "$gpus" "$nodes" "$tasks" "$qwait" >> "$JOBS"
  printf -v "JID_${label//-/_}" '%s' "$id"
  log "submitted $label=$id ($user ${args[*]})"
}
state_of() { squeue -h -j "$1" -o %T 2>/dev/null | head -1; }
wait_state() { # wait_state JOBID STATE-REGEX SECONDS
  for ((i = 0; i < $3 * 4; i++)); do
    state_of "$1" | grep -qE "^($2)$" && return 0
    sleep 0.25
  done
  die "job $1 did not reach $2 in $3 s (now: $(state_of "$1"))"
}
# slurmctld tells slurmdbd about a start a moment later (sacct lags squeue by a few seconds);
# a job that is cancelled or failed before that would still be fine, but waiting makes every
# attempt's accounting record complete before the next step
wait_sacct_state() { # wait_sacct_state SECONDS STATE JOBID...
  local t=$1 state=$2; shift 2
  local want=$#
  for ((i = 0; i < t * 4; i++)); do
    [ "$(sacct -n -X -P -j "$(IFS=,; echo "$*")" -o State 2>/dev/null | grep -c "^$state\$")" -ge "$want" ] && return 0
    sleep 0.25
  done
  die "sacct does not show $* $state after $t s"
}
# a restart-aware body: the first attempt outlives the test step that ends it, the rerun is short
RERUN='if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 300; else sleep 6; fi'

scontrol update nodename=gpu[01-02] state=resume >/dev/null 2>&1 || true
[ -z "$(squeue -h -a -o %i)" ] || die "the queue is not empty; run down.sh --purge && up.sh first"
[ "$(sinfo -h -N -o '%N %T' | sort -u | grep -cE ' idle$')" -ge 2 ] || die "both nodes must be idle"
for u in alice bob carol; do rm -f /home/$u/slurm-*.out; done
TASK_PLUGIN=$(scontrol show config | awk '/^TaskPlugin /{print $3}')
if [ "$TASK_PLUGIN" = task/cgroup ]; then CGROUP=true; OOM_STATE=OUT_OF_MEMORY; else CGROUP=false; OOM_STATE=FAILED; fi
log "task plugin $TASK_PLUGIN: the memory hog is expected to end $OOM_STATE"

# controller snapshots every second while the scenario runs, as slurmtel's slurmctld source
# takes them: the only record of which GPU indices each job held (sacct never stores them)
SNAPS="$OUT/snapshots"
rm -rf "$SNAPS"; mkdir -p "$SNAPS"
(
  while [ ! -e "$SNAPS/.stop" ]; do
    at=$(date -u +%Y%m%dT%H%M%S)
    squeue -a --json > "$SNAPS/squeue-$at.json.tmp" 2>/dev/null && mv "$SNAPS/squeue-$at.json.tmp" "$SNAPS/squeue-$at.json"
    scontrol show node -d > "$SNAPS/nodes-$at.txt.tmp" 2>/dev/null && mv "$SNAPS/nodes-$at.txt.tmp" "$SNAPS/nodes-$at.txt"
    sleep 1
  done
) &
SNAP_PID=$!
trap 'touch "$SNAPS/.stop"; wait "$SNAP_PID" 2>/dev/null' EXIT

# ------------------------------------------------------------------ phase 1: failures first
# gpu01 (4 GPUs): timeout, requeue, cancel-run, survivor; gpu02 (4 GPUs): the two node-fail jobs.
sub gpu1-timeout       bob   TIMEOUT            1 1 - 0 -w gpu01 --gres=gpu:1 -t 1 -- 'sleep 600'
sub gpu1-requeue       carol REQUEUED,COMPLETED 1 1 - 0 -w gpu01 --gres=gpu:1 -t 5 -- "$RERUN"
sub gpu1-cancel-run    alice CANCELLED          1 1 - 0 -w gpu01 --gres=gpu:1 -t 5 -- 'sleep 600'
sub survivor-gpu01     carol COMPLETED          1 1 - 0 -w gpu01 --gres=gpu:1 -t 5 -- 'sleep 20'
sub nodefail-norequeue bob   NODE_FAIL          2 1 - 0 -w gpu02 --no-requeue --gres=gpu:2 -t 5 -- 'sleep 600'
sub nodefail-requeue   alice NODE_FAIL,COMPLETED 2 1 - 0 -w gpu02 --requeue --gres=gpu:2 -t 5 -- "$RERUN"
# CPU-only jobs on gpu01 (8 CPUs, 4 taken): out of the node failure's way
# (perl, not python3: perl-base is Essential in Debian, python3 may be a per-user shim)
sub oom                carol "$OOM_STATE"       0 1 - 0 -w gpu01 -p debug --mem=100M -t 2 -- \
  'perl -e '"'"'$x = "a" x (400 * 1024 * 1024); sleep 30'"'"
sub cpu-debug          bob   COMPLETED          0 1 - 0 -w gpu01 -p debug -t 2 -- 'sleep 3'

for j in "$JID_gpu1_timeout" "$JID_gpu1_requeue" "$JID_gpu1_cancel_run" "$JID_survivor_gpu01" \
         "$JID_nodefail_norequeue" "$JID_nodefail_requeue"; do
  wait_state "$j" RUNNING 30
done
wait_sacct_state 30 RUNNING "$JID_gpu1_cancel_run" "$JID_gpu1_requeue" "$JID_nodefail_norequeue" "$JID_nodefail_requeue"
log "cancel running $JID_gpu1_cancel_run"; scancel "$JID_gpu1_cancel_run"
log "requeue $JID_gpu1_requeue"; scontrol requeue "$JID_gpu1_requeue" || die "requeue failed"
log "marking gpu02 DOWN"
scontrol update nodename=gpu02 state=down reason="slurmtel-lab simulated node failure"
wait_state "$JID_nodefail_requeue" PENDING 30   # requeued, held for cred_expire (Reason=BeginTime)
for ((i = 0; i < 120; i++)); do
  [ -z "$(state_of "$JID_nodefail_norequeue")" ] && [ -z "$(squeue -h -w gpu02 -o %i)" ] && break
  sleep 0.25
done
[ -z "$(squeue -h -w gpu02 -o %i)" ] || die "jobs still on gpu02 after it went down"
# With ReturnToService=2 the node may already be back once slurmd re-registers; then resume
# fails with "Invalid node state specified", which is harmless.
if sinfo -h -n gpu02 -o %T | grep -qiE 'down|drain'; then log "resuming gpu02"; scontrol update nodename=gpu02 state=resume || true; fi
for ((i = 0; i < 120; i++)); do sinfo -h -n gpu02 -o %T | grep -qx idle && break; sleep 0.25; done
sinfo -h -n gpu02 -o %T | grep -qx idle || die "gpu02 did not come back idle"
log "gpu02 is back"

# ------------------------------------------------------------------ phase 2: contention
# Free now: gpu01 2 GPUs (timeout and survivor hold 2, the requeued job comes back there),
# gpu02 4 GPUs (the requeued node-fail job comes back there). Only gpu02 can take a 4-GPU job
# until the timeout job ends, so gpus4-queued waits for gpus4-node, and gpus4-cancel-pend
# waits behind both and is cancelled while PENDING.
# (--gres=gpu:4 is per node; --gpus=4 would let Slurm split a job 2+2 over both nodes)
sub gpus4-node        carol COMPLETED 4 1 - 0 --gres=gpu:4 -t 5 -- 'sleep 12'
sub gpus4-queued      alice COMPLETED 4 1 - 1 --gres=gpu:4 -t 5 -- 'sleep 6'
sub gpus4-cancel-pend bob   CANCELLED 0 0 - 0 --gres=gpu:4 -t 5 -- 'sleep 6'
wait_state "$JID_gpus4_cancel_pend" PENDING 10
# Cancel only once slurmdbd has the job's PENDING record: a job cancelled before that is
# recorded with Start = the cancel time (and "None assigned" nodes), not Start = None.
wait_sacct_state 30 PENDING "$JID_gpus4_cancel_pend"
log "cancel pending $JID_gpus4_cancel_pend"; scancel "$JID_gpus4_cancel_pend"
sub gpu2-srun-ok      alice COMPLETED 2 1 - 0 --gres=gpu:2 -c 2 -t 5 -- \
  'srun --gres=gpu:2 bash -c "echo step CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES; sleep 8"'
sub gpu1-fail         carol FAILED    1 1 - 0 --gres=gpu:1 -t 5 -- 'sleep 2; exit 1'
sub gpu1-ok           bob   COMPLETED 1 1 - 0 --gres=gpu:1 -t 5 -- 'sleep 6'
sub gpu1-array        alice COMPLETED 1 1 4 0 --array=1-4%2 --gres=gpu:1 -t 5 -- 'sleep 4'
sub chem-as-alice     alice COMPLETED 1 1 - 0 -A chemistry --gres=gpu:1 -t 5 -- 'sleep 4'
# every TRES sreport reports (issue 27): memory asked with --mem (the rest take DefMemPerCPU),
# several CPUs, CPU-only jobs on one and on two nodes
sub gpu1-mem          alice COMPLETED 1 1 - 0 --gres=gpu:1 -c 2 --mem=1200M -t 5 -- 'sleep 5'
sub cpu-mem           bob   COMPLETED 0 1 - 0 -p debug -c 3 --mem=1500M -t 2 -- 'sleep 5'
sub multinode-cpu     carol COMPLETED 0 2 - 0 -p debug -N 2 --ntasks-per-node=1 --mem=600M -t 2 -- \
  'srun -N2 sleep 4'
sub multinode-gpu     carol COMPLETED 2 2 - 0 -N 2 --gpus-per-node=1 -t 5 -- \
  'srun -N2 bash -c "echo \$(hostname) \$SLURMD_NODENAME CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES; sleep 6"'
[ "$(state_of "$JID_gpus4_cancel_pend")" = "" ] || die "gpus4-cancel-pend is still in the queue"

# ------------------------------------------------------------------ drain
for ((i = 0; i < 600; i++)); do
  [ -z "$(squeue -h -a -o %i)" ] && break
  [ $((i % 40)) = 0 ] && log "waiting: $(squeue -h -a -o '%j:%T:%r' | tr '\n' ' ')"
  sleep 0.25
done
[ -z "$(squeue -h -a -o %i)" ] || die "jobs still queued after 150 s"
touch "$SNAPS/.stop"; wait "$SNAP_PID" 2>/dev/null; trap - EXIT
# the last end records reach slurmdbd a moment after the jobs leave squeue
S=$(iso "$START_EPOCH")
for ((i = 0; i < 120; i++)); do
  open=$(sacct -a -D -X -n -P -S "$S" -o JobIDRaw,State,End | grep -cE '\|(PENDING|RUNNING|COMPLETING)\||\|Unknown$')
  [ "$open" = 0 ] && break
  sleep 0.25
done
[ "$open" = 0 ] || die "sacct still shows $open unfinished records"

END_EPOCH=$(( $(date +%s) + 1 ))
sleep 1.1
START_ISO=$(iso "$START_EPOCH"); END_ISO=$(iso "$END_EPOCH")
echo "$START_ISO $END_ISO" > "$OUT/window.txt"
sacct -a -D -X -P -S "$START_ISO" -E "$END_ISO" \
  --format=JobID,JobIDRaw,JobName,User,Account,Partition,State,ExitCode,Submit,Eligible,Start,End,AllocTRES,NodeList \
  > "$OUT/sacct-a-D-X.psv" 2>&1
for u in alice bob carol; do cat /home/$u/slurm-*.out 2>/dev/null | sed "s/^/$u: /"; done > "$OUT/job-stdout.txt"

# manifest.json last (written to a temp name, then renamed): its presence means a complete run
{
  printf '{\n  "cluster": "lab",\n  "window": {"start": "%sZ", "end": "%sZ"},\n' "$START_ISO" "$END_ISO"
  printf '  "task_plugin": "%s",\n  "cgroup": %s,\n  "jobs": [\n' "$TASK_PLUGIN" "$CGROUP"
  tail -n +2 "$JOBS" | awk -F'\t' '
    function q(s) { return "\"" s "\"" }
    { n = split($5, st, ","); ex = ""; for (i = 1; i <= n; i++) ex = ex (i > 1 ? ", " : "") q(st[i])
      line = sprintf("    {\"label\": %s, \"job_id\": %s, \"user\": %s, \"account\": %s, \"expected\": [%s], " \
                     "\"gpus\": %s, \"nodes\": %s, \"array_tasks\": %s, \"queue_wait\": %s}",
                     q($1), $2, q($3), q($4), ex, $6, $7, ($8 == "-" ? "null" : $8), ($9 == 1 ? "true" : "false"))
      lines[NR] = line }
    END { for (i = 1; i <= NR; i++) print lines[i] (i < NR ? "," : "") }'
  printf '  ]\n}\n'
} > "$OUT/manifest.json.tmp"
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: window $START_ISO .. $END_ISO, $(($(wc -l < "$JOBS") - 1)) jobs, total $(( $(date +%s) - T0 ))s"
