"""Words several layers share (the store's SQL, the attribution, the reports), in a module
that imports nothing: a command that needs one of them does not build the typed records of
slurmtel.records (25 frozen dataclasses, about 27 ms of its start: issue 28)."""

from __future__ import annotations

# States an attempt ends in when Slurm runs the same job again (sacct -D shows each attempt).
REQUEUE_STATES = ("REQUEUED", "NODE_FAIL", "PREEMPTED", "REQUEUE_FED", "REQUEUE_HOLD")

# The causes an idle GPU-second is put in (docs/idle-causes.md), each in
# gpu_attribution_part.cause_<name>_seconds. The attribution decides no_process first and the
# rest by its precedence; reports list them in this order.
IDLE_CAUSES = (
    "no_process",
    "hardware",
    "storage_wait",
    "network_wait",
    "cpu_bound",
    "idle_unexplained",
    "unmeasured",
)
