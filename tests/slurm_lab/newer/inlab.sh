#!/bin/bash
# inlab.sh 24.11|26.05 CMD...   run CMD inside the running lab, e.g. inlab.sh 26.05 squeue -a --json
#   TZ and SLURM_TIME_FORMAT pass through; SLURMTEL_LAB_FAKETIME=+61m runs CMD under the lab's
#   libfaketime (LD_PRELOAD inside the chroot, never on the host side): see force-rollup.sh.
# Adapted from ../shared/slurm-lab-newer/inlab.sh.
. "$(dirname "$0")/lab.sh" "${1:?usage: inlab.sh 24.11|26.05 CMD...}"; shift
if [ -n "${SLURMTEL_LAB_FAKETIME:-}" ]; then LAB_ENV="LD_PRELOAD=$FTLIB FAKETIME=$SLURMTEL_LAB_FAKETIME"; fi
LAB_EXEC=exec L "$@"
