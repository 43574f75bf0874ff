#!/bin/bash
# scenario.sh 24.11|26.05 OUTDIR   run ../scenario.sh (the integration job mix) inside that lab
# and copy what it wrote (manifest.json, snapshots/, ...) to OUTDIR on the host.
# up.sh installed the script into the chroot (/opt/slurmtel-lab/scenario.sh); it runs there with
# the lab's own clients, in UTC, exactly as ../scenario.sh runs on the host's 22.05 lab.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lab.sh" "${1:?usage: scenario.sh 24.11|26.05 OUTDIR}"
OUT=${2:?usage: scenario.sh 24.11|26.05 OUTDIR}
IN_LAB=/var/tmp/slurmtel-lab/run
rm -rf "$ROOT$IN_LAB" "$OUT"
TZ=UTC L bash /opt/slurmtel-lab/scenario.sh "$IN_LAB"
mkdir -p "$(dirname "$OUT")"
cp -a "$ROOT$IN_LAB" "$OUT"
