"""Slurm's MailProg: `slurmtel mailprog -s SUBJECT RECIPIENT` (slurm.conf MailProg= the wrapper
systemd/slurmtel-mailprog.sh).

slurmctld runs MailProg as `MailProg -s "Slurm Job_id=123 Name=train Ended, Run time 00:10:02,
COMPLETED, ExitCode 0" alice@example.org`, and since Slurm 21.08 with SLURM_JOB_ID,
SLURM_JOB_MAIL_TYPE, SLURM_CLUSTER_NAME ... in its environment. A job-end mail (Ended, Failed)
becomes a request the job_end rule answers with the job's summary once its record and last
telemetry are in (action_mail_request); every other mail (Began, Requeued, time limit, array
summaries) is handed to actions.mailprog.fallback_command unchanged, and so is a job-end mail
that cannot be recorded (no database): a user never loses a mail Slurm sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# what the job_end rule answers
END_TYPES = ("Ended", "Failed")
_SUBJECT = re.compile(
    r"^Slurm (?P<array>Array (?:Summary|Task) )?Job_id=(?P<job_id>\S+)(?: \((?P<raw>\d+)\))? "
    r"Name=(?P<name>.*) (?P<type>Began|Ended|Failed|Requeued|Staged Out|Invalid dependency"
    r"|Reached time limit|Reached \d+% of time limit)(?:,|$)"
)


@dataclass(frozen=True)
class MailRequest:
    job_id: str
    job_id_raw: int | None
    mail_type: str
    cluster: str
    # an array's summary mail is about every task: not one job's summary
    array_summary: bool


def parse_mail(subject: str, environ: Mapping[str, str], default_cluster: str) -> MailRequest | None:
    """What Slurm asked for, from its environment (21.08+) or else its subject; None when it is
    not a mail about one job."""
    match = _SUBJECT.match(subject.strip())
    env_type = environ.get("SLURM_JOB_MAIL_TYPE", "").strip()
    env_job = environ.get("SLURM_JOB_ID", "").strip()
    cluster = environ.get("SLURM_CLUSTER_NAME", "").strip() or default_cluster
    if match is None and not (env_type and env_job.isdigit()):
        return None
    job_id = match.group("job_id") if match else env_job
    raw_text = (match.group("raw") if match else None) or (env_job if env_job.isdigit() else None)
    if raw_text is None and job_id.isdigit():
        raw_text = job_id
    mail_type = env_type or (match.group("type") if match else "")
    summary = bool(match and (match.group("array") or "").startswith("Array Summary")) or job_id.endswith(
        "_*"
    )
    return MailRequest(job_id, int(raw_text) if raw_text else None, mail_type, cluster, summary)
