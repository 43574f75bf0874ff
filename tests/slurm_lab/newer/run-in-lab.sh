#!/bin/bash
# run-in-lab.sh 24.11|26.05 SCRIPT OUTDIR [ARGS...]
# Run a lab script that writes into the directory it is given (../scenario.sh, ../capture.sh)
# inside that lab, where the repository is not visible: SCRIPT is copied into the chroot
# (/opt/slurmtel-lab/), runs there as root with the lab's own clients, in UTC, exactly as it
# runs on the host's 22.05 lab, and what it wrote is copied to OUTDIR on the host.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lab.sh" "${1:?usage: run-in-lab.sh 24.11|26.05 SCRIPT OUTDIR [ARGS...]}"
SCRIPT=${2:?usage: run-in-lab.sh 24.11|26.05 SCRIPT OUTDIR [ARGS...]}
OUT=${3:?usage: run-in-lab.sh 24.11|26.05 SCRIPT OUTDIR [ARGS...]}
shift 3
NAME=$(basename "$SCRIPT" .sh)
IN_LAB=/var/tmp/slurmtel-lab/$NAME
install -d "$ROOT/opt/slurmtel-lab"
install -m 755 "$SCRIPT" "$ROOT/opt/slurmtel-lab/$NAME.sh"
rm -rf "$ROOT$IN_LAB" "$OUT"
set +e
TZ=UTC L bash "/opt/slurmtel-lab/$NAME.sh" "$IN_LAB" "$@"
rc=$?
set -e
# copied out whether or not it worked: a failed run's partial output is what explains it
if [ -d "$ROOT$IN_LAB" ]; then mkdir -p "$(dirname "$OUT")"; cp -a "$ROOT$IN_LAB" "$OUT"; fi
exit $rc
