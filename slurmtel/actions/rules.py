"""What each rule decides now: the messages to send and the jobs to cancel, each with its reason
and evidence. Reads only; slurmtel.actions.cycle records the decisions and delivers them.

Steps of the GPU rules (gpus_no_process, gpus_idle), once per job each:

- a GPU's stretch: from the later of the job's start and the start of the GPU's current stretch
  of idle (or process-less) windows to its newest window's end; a GPU whose newest window is
  older than actions.telemetry_max_age_seconds is not measured now, and counts for nothing;
- the job's stretch: with gpus = "any", that of its GPUs in the condition longest; with
  "all", the shortest of all its GPUs (every GPU the job holds must be mapped and measured);
- the step taken is the highest one whose time the stretch has reached, unless that step or a
  later one was already taken: a job first seen after 110 idle minutes gets the final warning,
  never the first one as well;
- cancel: only with cancel = true, once the stretch reached cancel_minutes, when the final
  warning reached the owner during this stretch and grace_minutes ago; the job's state and its
  GPUs' windows are checked again just before scancel (slurmtel.actions.deliver). Otherwise the
  job is skipped with the reason (`act --dry-run` lists them).

A rule that would act on more jobs (nodes, accounts) than its max_jobs_per_run in one evaluation
acts on none and alerts the admins instead (once a day while it lasts).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from slurmtel.access import EVERYTHING
from slurmtel.actions.figures import FIGURES, TEMPLATE_FIGURES, figure, figures_from, jsonable
from slurmtel.actions.recipients import Recipient, Recipients
from slurmtel.actions.render import safe_text
from slurmtel.actions.settings import (
    GPU_KINDS,
    KIND_BUDGET,
    KIND_IDLE,
    KIND_JOB_END,
    KIND_MONTH_CLOSED,
    KIND_NO_PROCESS,
    KIND_NODE_HEALTH,
    ActionRule,
)
from slurmtel.config import Config
from slurmtel.reports.render import gpu_name
from slurmtel.store.actions import EndedJob, Exclusion, RunningAttempt, TakenStep
from slurmtel.store.sql import Connection

log = logging.getLogger(__name__)

STEP_ORDER = {"warning": 0, "final_warning": 1, "cancel": 2}
STEPS = ("warning", "final_warning", "cancel")
# how long after its end a job's last telemetry is in (the follow-up pull, attribution)
SETTLE_EXTRA_SECONDS = 60


@dataclass
class Decision:
    """One thing a rule would do now."""

    rule: ActionRule
    subject: str
    step: str
    kind: str  # message | cancel | alert
    template: str
    reason: str
    evidence: dict[str, Any]
    context: dict[str, Any]
    recipients: list[Recipient] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cluster: str = ""
    job_id_raw: int | None = None
    submit_at: datetime | None = None
    job_id: str = ""
    user: str = ""
    account: str = ""
    node: str = ""
    # the MailProg requests this decision answers (marked handled with it)
    request_ids: tuple[int, ...] = ()
    # recorded without sending anything (an excluded job's summary: the record says why)
    silent: bool = False

    @property
    def webhooks(self) -> list[str]:
        return [] if self.silent else list(self.rule.webhooks)

    @property
    def acts(self) -> bool:
        """Whether it sends or does something (what max_jobs_per_run counts)."""
        return not self.silent


@dataclass(frozen=True)
class Skip:
    """A job (node, account) a rule matched and does not act on now, and why."""

    rule: str
    subject: str
    job_id: str
    reason: str


@dataclass
class Evaluation:
    """What one evaluation knows besides the database."""

    config: Config
    now: datetime
    recipients: Recipients
    exclusions: Mapping[str, Exclusion]
    skipped: list[Skip] = field(default_factory=list)
    # (kind, attempt) -> its GPUs' stretches, computed once per evaluation
    _stretches: dict[tuple[str, int], list[GpuStretch]] = field(default_factory=dict)

    def skip(self, rule: ActionRule, subject: str, job_id: str, reason: str) -> None:
        self.skipped.append(Skip(rule.name, subject, job_id, reason))

    def stretches(self, kind: str, attempt: RunningAttempt) -> list[GpuStretch]:
        key = (kind, id(attempt))
        found = self._stretches.get(key)
        if found is None:
            found = self._stretches[key] = gpu_stretches(
                kind, attempt, self.now, self.config.actions.telemetry_max_age_seconds
            )
        return found


def job_subject(cluster: str, job_id_raw: int, submit_at: datetime) -> str:
    return f"job:{cluster}:{job_id_raw}:{submit_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def job_link(config: Config, job_id: str) -> str:
    base = config.actions.base_url.rstrip("/")
    return f"{base}/jobs/{job_id}" if base else ""


# ------------------------------------------------------------------ selection and exclusions


def is_interactive(config: Config, name: str, submit_line: str) -> bool:
    """salloc or srun submissions, and jobs named as actions.interactive_job_names says."""
    first = submit_line.strip().split(maxsplit=1)[0] if submit_line.strip() else ""
    if PurePosixPath(first).name in ("salloc", "srun"):
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in config.actions.interactive_job_names)


def selected(rule: ActionRule, cluster: str, partition: str) -> bool:
    return (not rule.clusters or cluster in rule.clusters) and (
        not rule.partitions or partition in rule.partitions
    )


def exclusion_reason(
    rule: ActionRule,
    ev: Evaluation,
    *,
    user: str,
    account: str,
    partition: str,
    qos: str,
    name: str,
    submit_line: str,
    length_seconds: float | None,
) -> str | None:
    """Why RULE leaves this job alone (None: it does not). LENGTH_SECONDS: the time limit of a
    running job, the run time of an ended one (None: not known)."""
    excluded = ev.exclusions.get(user)
    if excluded is not None:
        return f"user {user} is on the exclusion list until {excluded.ends_at:%Y-%m-%d %H:%M %Z} ({excluded.reason})"
    if user in rule.exclude_users:
        return f"user {user} is in exclude_users"
    if account in rule.exclude_accounts:
        return f"account {account} is in exclude_accounts"
    if partition in rule.exclude_partitions:
        return f"partition {partition} is in exclude_partitions"
    if qos and qos in rule.exclude_qos:
        return f"QOS {qos} is in exclude_qos"
    for pattern in rule.exclude_job_names:
        if fnmatch.fnmatchcase(name, pattern):
            return f"the job name matches exclude_job_names '{pattern}'"
    limit = rule.exclude_shorter_than_minutes
    if limit and length_seconds is not None and length_seconds < limit * 60:
        return f"the job is shorter than exclude_shorter_than_minutes ({limit})"
    if rule.exclude_interactive and is_interactive(ev.config, name, submit_line):
        return "an interactive job (exclude_interactive)"
    return None


# ------------------------------------------------------------------ money


def cost_so_far(
    config: Config,
    *,
    partition: str,
    gpu_model: str,
    gpu_seconds: float,
    billing_seconds: float,
    at: datetime,
) -> Decimal | None:
    """What GPU_SECONDS (or the billing TRES) cost at the rates of AT's month, as chargeback
    prices them; None when no rate prices them."""
    from slurmtel.chargeback import charge, match_rate

    chargeback = config.chargeback
    if chargeback.use_billing_tres:
        if billing_seconds <= 0:
            return None
        return charge(Decimal(chargeback.billing_rate), Decimal(str(billing_seconds)), chargeback.currency)
    local = at.astimezone(config.zone)
    rate = match_rate(chargeback.rates, partition, gpu_model or "unknown", local.date().replace(day=1))
    if rate is None:
        return None
    return charge(rate.price(), Decimal(str(gpu_seconds)), chargeback.currency)


# ------------------------------------------------------------------ GPU rules


@dataclass(frozen=True)
class GpuStretch:
    gpu: str
    node: str
    gpu_uuid: str
    source: str | None
    measured_to: datetime | None
    # None: not measured now (no windows, or none recent)
    length_seconds: float | None
    start_at: datetime | None
    idle_seconds: float | None
    no_process_seconds: float | None
    util_max_percent: float | None
    memory_max_bytes: int | None


def gpu_stretches(
    kind: str, attempt: RunningAttempt, now: datetime, max_age_seconds: float
) -> list[GpuStretch]:
    """ATTEMPT's GPUs and how long each has been idle (KIND gpus_idle) or without a process
    (gpus_no_process) at NOW."""
    fresh_after = now - timedelta(seconds=max_age_seconds)
    result = []
    for g in attempt.gpus:
        end = (
            g.last_window_end_at
            if g.last_window_end_at is not None and g.last_window_end_at > fresh_after
            else None
        )
        idle = _stretch(end, g.idle_since_at, attempt.start_at)
        no_process = _stretch(end, g.no_process_since_at, attempt.start_at)
        mine = no_process if kind == KIND_NO_PROCESS else idle
        since = g.no_process_since_at if kind == KIND_NO_PROCESS else g.idle_since_at
        result.append(
            GpuStretch(
                gpu=gpu_name(g.node, g.gpu_index, g.gpu_uuid),
                node=g.node,
                gpu_uuid=g.gpu_uuid,
                source=g.source,
                measured_to=g.last_window_end_at,
                length_seconds=mine,
                start_at=max(since, attempt.start_at) if since is not None and mine is not None else None,
                idle_seconds=idle,
                no_process_seconds=no_process,
                util_max_percent=g.idle_util_max_percent,
                memory_max_bytes=g.idle_memory_used_max_bytes,
            )
        )
    return result


def _stretch(end: datetime | None, since: datetime | None, start_at: datetime) -> float | None:
    """Seconds from the later of SINCE and START_AT to END (the newest fresh window's end)."""
    if end is None or since is None:
        return None
    return max(0.0, (end - max(since, start_at)).total_seconds())


def matched_gpus(
    rule: ActionRule, attempt: RunningAttempt, stretches: Sequence[GpuStretch], seconds: float
) -> list[GpuStretch]:
    """The GPUs in the rule's condition for at least SECONDS; [] when the job is not (with
    gpus = "all": every GPU of the job, mapped and measured, or none)."""
    long_enough = [s for s in stretches if s.length_seconds is not None and s.length_seconds >= seconds]
    if rule.gpus == "all" and (len(long_enough) < len(stretches) or len(stretches) < attempt.alloc_gpus):
        return []
    return long_enough


def step_minutes(rule: ActionRule) -> list[tuple[str, int]]:
    return [
        (step, minutes)
        for step, minutes in zip(
            STEPS, (rule.warn_minutes, rule.final_warning_minutes, rule.cancel_minutes), strict=True
        )
        if minutes
    ]


def gpu_rule_decisions(
    rule: ActionRule,
    attempts: Iterable[RunningAttempt],
    taken: Mapping[tuple[str, str], Mapping[str, TakenStep]],
    ev: Evaluation,
) -> list[Decision]:
    now = ev.now
    first = min(minutes for _, minutes in step_minutes(rule)) * 60
    decisions = []
    for a in attempts:
        if not selected(rule, a.cluster, a.partition):
            continue
        stretches = ev.stretches(rule.kind, a)
        if not matched_gpus(rule, a, stretches, first):
            continue
        subject = job_subject(a.cluster, a.job_id_raw, a.submit_at)
        why = exclusion_reason(
            rule,
            ev,
            user=a.user,
            account=a.account,
            partition=a.partition,
            qos=a.qos,
            name=a.name,
            submit_line=a.submit_line,
            length_seconds=a.time_limit_seconds,
        )
        if why is not None:
            ev.skip(rule, subject, a.job_id, f"excluded: {why}")
            continue
        # the highest step the stretch has reached
        reached = [(step, m) for step, m in step_minutes(rule) if matched_gpus(rule, a, stretches, m * 60)]
        step, minutes = reached[-1]
        done = taken.get((rule.name, subject), {})
        if step == "cancel" and not rule.cancel:
            ev.skip(
                rule,
                subject,
                a.job_id,
                f"{rule.cancel_minutes} minutes reached; cancel = false (no cancellation)",
            )
            step, minutes = reached[-2] if len(reached) > 1 else (None, 0)  # type: ignore[assignment]
            if step is None:
                continue
        if step == "cancel":
            if "cancel" in done:
                continue
            final = done.get("final_warning")
            if final is None:
                # no final warning yet (a job first seen this late): the final warning first
                step, minutes = "final_warning", rule.final_warning_minutes
            else:
                matched = matched_gpus(rule, a, stretches, minutes * 60)
                began = max(s.start_at for s in matched if s.start_at is not None)
                told = final.owner_delivered_at
                if told is None:
                    ev.skip(
                        rule, subject, a.job_id, "cancel waits: the final warning has not reached the owner"
                    )
                    continue
                if told < began:
                    ev.skip(
                        rule, subject, a.job_id, "no cancel: the final warning was about an earlier stretch"
                    )
                    continue
                if now - told < timedelta(minutes=rule.grace_minutes):
                    ev.skip(
                        rule,
                        subject,
                        a.job_id,
                        f"cancel waits: grace until {told + timedelta(minutes=rule.grace_minutes):%H:%M:%S %Z}",
                    )
                    continue
        if any(STEP_ORDER[s] >= STEP_ORDER[step] for s in done):
            continue
        decisions.append(_gpu_decision(rule, a, stretches, step, minutes, ev))
    return decisions


def _gpu_decision(
    rule: ActionRule,
    a: RunningAttempt,
    stretches: Sequence[GpuStretch],
    step: str,
    minutes: int,
    ev: Evaluation,
) -> Decision:
    config, now = ev.config, ev.now
    matched = matched_gpus(rule, a, stretches, minutes * 60)
    elapsed = max(0.0, (now - a.start_at).total_seconds())
    stretch = min(s.length_seconds or 0.0 for s in matched)
    gpu_seconds = a.alloc_gpus * elapsed
    cost = cost_so_far(
        config,
        partition=a.partition,
        gpu_model=a.gpu_model,
        gpu_seconds=gpu_seconds,
        billing_seconds=a.billing * elapsed,
        at=now,
    )
    figures = {
        "gpus": a.alloc_gpus,
        "elapsed_seconds": round(elapsed, 1),
        "time_limit_seconds": a.time_limit_seconds,
        "allocated_gpu_seconds": round(gpu_seconds, 1),
        "matched_gpus": len(matched),
        "stretch_seconds": round(stretch, 1),
        "cost_so_far_amount": cost,
    }
    gpus = [
        {
            "gpu": s.gpu,
            "gpu_uuid": s.gpu_uuid,
            "node": s.node,
            "source": s.source,
            "measured_to": s.measured_to,
            "matched": s in matched,
            "idle_stretch_seconds": None if s.idle_seconds is None else round(s.idle_seconds, 1),
            "no_process_stretch_seconds": None
            if s.no_process_seconds is None
            else round(s.no_process_seconds, 1),
            "idle_stretch_util_max_share": figure("idle_stretch_util_max_share", s.util_max_percent),
            "idle_stretch_memory_used_max_bytes": s.memory_max_bytes,
        }
        for s in stretches
    ]
    what = "with no process" if rule.kind == KIND_NO_PROCESS else "idle"
    reason = (
        f"{len(matched)} of {a.alloc_gpus} GPUs of job {a.job_id} {what} for {stretch / 60:.0f} min "
        f"(>= {minutes} min, {step.replace('_', ' ')}; gpus = {rule.gpus})"
    )
    if len(stretches) < a.alloc_gpus:
        reason += f"; {a.alloc_gpus - len(stretches)} GPU(s) not mapped"
    settings = {
        "idle_threshold_percent": config.agent.idle_threshold_percent,
        "idle_memory_max_bytes": config.actions.idle_memory_max_bytes,
        "telemetry_max_age_seconds": config.actions.telemetry_max_age_seconds,
    }
    evidence = {
        "job": {"cluster": a.cluster, "job_id": a.job_id, "start_at": a.start_at, "nodes": list(a.nodes)},
        "threshold_minutes": minutes,
        "gpus_mode": rule.gpus,
        "figures": figures,
        "gpus": [{k: v for k, v in g.items()} for g in gpus],
        "settings": settings,
        "currency": config.chargeback.currency,
    }
    recipients, notes = ev.recipients.resolve(rule, user=a.user, account=a.account)
    context = {
        "job": _job_context(
            cluster=a.cluster,
            job_id=a.job_id,
            name=a.name,
            user=a.user,
            account=a.account,
            partition=a.partition,
            state=a.state,
            start_at=a.start_at,
        ),
        "figures": figures,
        "gpus": [g for g in gpus if g["matched"]],
        "settings": settings,
        "currency": config.chargeback.currency,
    }
    return Decision(
        rule=rule,
        subject=job_subject(a.cluster, a.job_id_raw, a.submit_at),
        step=step,
        kind="cancel" if step == "cancel" else "message",
        template=f"{rule.kind}-{step}",
        reason=reason,
        evidence=jsonable(evidence),
        context=context,
        recipients=recipients,
        notes=notes,
        cluster=a.cluster,
        job_id_raw=a.job_id_raw,
        submit_at=a.submit_at,
        job_id=a.job_id,
        user=a.user,
        account=a.account,
    )


def _job_context(**fields: Any) -> dict[str, Any]:
    """A job's identity for a template: user-given text with its control characters escaped."""
    return {k: safe_text(v) if isinstance(v, str) else v for k, v in fields.items()}


# ------------------------------------------------------------------ job end


_JOB_END_NAMES = tuple(
    n
    for n in (
        "elapsed_seconds",
        "time_limit_seconds",
        "queue_wait_seconds",
        "cpus",
        "cpu_efficiency_share",
        "mem_peak_bytes",
        "mem_requested_bytes",
    )
    if n in FIGURES
)
_GPU_END_NAMES = (
    "mean_util_share",
    "max_util_share",
    "idle_share",
    "covered_share",
    "memory_used_max_bytes",
    "power_mean_watts",
    "energy_joules",
)


def job_end_decisions(
    rule: ActionRule,
    conn: Connection,
    ev: Evaluation,
    requests: Sequence[EndedJob],
    recently_ended: Sequence[EndedJob],
    recorded: set[tuple[str, str]],
) -> list[Decision]:
    """A summary per ended job (per job whose owner asked, with only_when_asked)."""
    config, now = ev.config, ev.now
    settle = timedelta(
        seconds=config.agent.summary_window_seconds
        + config.daemon.job_end_delay_seconds
        + config.sources.agent.interval_seconds
        + SETTLE_EXTRA_SECONDS
    )
    wait = timedelta(seconds=config.actions.mailprog.wait_seconds)
    # per job: its attempt and the addresses Slurm gave for it
    jobs: dict[tuple[str, str], tuple[EndedJob, list[str], list[int], datetime | None]] = {}
    for r in requests if rule.only_when_asked else recently_ended:
        key = (r.cluster, r.job_id)
        job, addresses, ids, received = jobs.get(key, (r, [], [], r.received_at))
        addresses.extend(a.strip() for a in r.recipient.split(",") if a.strip())
        if r.request_id is not None:
            ids.append(r.request_id)
        jobs[key] = (job, addresses, ids, received)
    decisions = []
    for (cluster, job_id), (job, addresses, ids, received) in jobs.items():
        found = job.submit_at is not None and job.job_id_raw is not None
        subject = f"jobid:{cluster}:{job_id}"
        if job.job_id_raw is not None and job.submit_at is not None:
            subject = job_subject(cluster, job.job_id_raw, job.submit_at)
        if (subject, "summary") in recorded:
            if ids:
                decisions.append(_handled_only(rule, subject, ids))
            continue
        if found and not selected(rule, cluster, job.partition):
            if ids:
                decisions.append(_handled_only(rule, subject, ids))
            continue
        end_at = job.end_at if found else None
        complete = bool(
            end_at is not None
            and (job.alloc_gpus == 0 or (job.computed_to is not None and job.computed_to >= end_at))
            and now >= end_at + settle
        )
        since = received if received is not None else job.end_at
        waited = since is not None and now >= since + wait
        if not complete and not waited:
            ev.skip(rule, subject, job_id, "waits for the job's accounting record and last telemetry")
            continue
        length = (job.end_at - job.start_at).total_seconds() if job.end_at and job.start_at else None
        why = (
            exclusion_reason(
                rule,
                ev,
                user=job.user,
                account=job.account,
                partition=job.partition,
                qos=job.qos,
                name=job.name,
                submit_line=job.submit_line,
                length_seconds=length,
            )
            if found
            else None
        )
        decision = _job_end_decision(rule, conn, ev, job, subject, addresses, complete)
        decision.request_ids = tuple(ids)
        if why is not None:
            decision.silent, decision.recipients = True, []
            decision.reason = f"excluded: {why}"
        decisions.append(decision)
    return decisions


def _handled_only(rule: ActionRule, subject: str, ids: list[int]) -> Decision:
    """Marks MailProg requests handled that need no new summary (one was decided already)."""
    return Decision(rule, subject, "summary", "message", "", "", {}, {}, request_ids=tuple(ids), silent=True)


def _job_end_decision(
    rule: ActionRule,
    conn: Connection,
    ev: Evaluation,
    job: EndedJob,
    subject: str,
    addresses: list[str],
    complete: bool,
) -> Decision:
    from slurmtel.reports.researcher import JobQuery, job_document
    from slurmtel.store.samples import sample_store

    config, now = ev.config, ev.now
    document: dict[str, Any] = {}
    if job.submit_at is not None:
        query = JobQuery(
            job.job_id, (job.cluster,), now, config.zone, EVERYTHING, samples=sample_store(config)
        )
        reports = job_document(conn, query)
        document = next(
            (r for r in reports if r["submit_at"] == job.submit_at), reports[0] if reports else {}
        )
    elapsed = document.get("elapsed_seconds")
    gpus = int(document.get("gpus") or job.alloc_gpus or 0)
    gpu_seconds = gpus * float(elapsed or 0)
    figures = figures_from(document, _JOB_END_NAMES)
    figures.update(
        gpus=gpus,
        allocated_gpu_seconds=round(gpu_seconds, 1),
        cost_so_far_amount=cost_so_far(
            config,
            partition=job.partition,
            gpu_model=str(document.get("gpu_model") or ""),
            gpu_seconds=gpu_seconds,
            billing_seconds=0.0,
            at=job.end_at or now,
        ),
    )
    gpu_rows = [
        {"gpu": g["gpu"], "gpu_uuid": g["gpu_uuid"], **figures_from(g, _GPU_END_NAMES)}
        for g in document.get("gpu_figures", [])
    ]
    owner = ",".join(dict.fromkeys(addresses))
    recipients, notes = ev.recipients.resolve(rule, user=job.user, account=job.account, owner_address=owner)
    if addresses and len(recipients) > 0 and any(role == "owner" for _, role in recipients):
        # Slurm's --mail-user may name several addresses: each is the owner's
        others = [(a, r) for a, r in recipients if r != "owner"]
        recipients = [(a, "owner") for a in dict.fromkeys(addresses)] + others
    state = job.state or (
        job.mail_subject.split(",")[-2].strip() if job.mail_subject.count(",") >= 2 else "ENDED"
    )
    context = {
        "job": _job_context(
            cluster=job.cluster,
            job_id=job.job_id,
            name=job.name or "",
            user=job.user or "",
            account=job.account,
            partition=job.partition,
            state=state,
            start_at=job.start_at,
            end_at=job.end_at,
            exit_code=str(document.get("exit_code") or ""),
        ),
        "figures": figures,
        "gpus": gpu_rows,
        "advice": [safe_text(line) for line in document.get("advice", [])],
        "complete": complete,
        "wait_minutes": config.actions.mailprog.wait_seconds // 60,
        "link": job_link(config, job.job_id),
        "currency": config.chargeback.currency,
    }
    reason = f"job {job.job_id} ended ({state})" + (
        f"; summary asked by Slurm's MailProg ({job.mail_type})" if job.request_id is not None else ""
    )
    if not complete:
        reason += "; its figures were not complete when the wait ran out"
    return Decision(
        rule=rule,
        subject=subject,
        step="summary",
        kind="message",
        template="job_end-summary",
        reason=reason,
        evidence=jsonable({"figures": figures, "gpus": gpu_rows, "advice": document.get("advice", [])}),
        context=context,
        recipients=recipients,
        notes=notes,
        cluster=job.cluster,
        job_id_raw=job.job_id_raw,
        submit_at=job.submit_at,
        job_id=job.job_id,
        user=job.user,
        account=job.account,
    )


# ------------------------------------------------------------------ node health


def node_health_decisions(
    rule: ActionRule,
    ev: Evaluation,
    nodes: Sequence[Mapping[str, Any]],
    latest_events: Mapping[str, Mapping[str, datetime]],
    bad_runs: Sequence[Any],
    newest_failures: Mapping[str, datetime] | None = None,
) -> list[Decision]:
    """Per node: new XID or double-bit ECC events (once a node and UTC day of the newest), a
    failure share above failed_share (once a node and UTC day of the newest failure), a
    driver/CUDA version unlike the cluster's
    (once per version), and per acceptance run that failed or fell below its baseline."""
    now = ev.now
    decisions = []
    for n in nodes:
        node, cluster = n["node"], n["cluster"] or ""
        subject = f"node:{cluster}:{node}"
        events = latest_events.get(node, {})
        node_figures = figures_from(
            n,
            ("attempts", "failed_attempts", "xid_events", "ecc_single_bit_errors", "ecc_double_bit_errors"),
        )
        node_figures["failed_attempts_share"] = (
            round(n["failed_attempts"] / n["attempts"], 4) if n["attempts"] else None
        )
        found: list[tuple[str, str, str]] = []
        if rule.xid and n["xid_events"] and "xid" in events:
            found.append(
                (
                    "xid",
                    f"xid:{events['xid'].astimezone(UTC):%Y-%m-%d}",
                    f"{n['xid_events']} GPU XID error(s)",
                )
            )
        if rule.ecc and n["ecc_double_bit_errors"] and "ecc_double_bit" in events:
            found.append(
                (
                    "ecc",
                    f"ecc:{events['ecc_double_bit'].astimezone(UTC):%Y-%m-%d}",
                    f"{n['ecc_double_bit_errors']} double-bit ECC error(s)",
                )
            )
        attempts, failed = n["attempts"], n["failed_attempts"]
        if attempts >= rule.min_attempts and attempts and failed / attempts >= rule.failed_share:
            newest = (newest_failures or {}).get(node, now)
            found.append(
                (
                    "failed",
                    f"failed:{newest.astimezone(UTC):%Y-%m-%d}",
                    f"{failed} of {attempts} job attempts failed on it",
                )
            )
        if rule.drift and (n["driver_drift"] or n["cuda_drift"]):
            found.append(
                (
                    "drift",
                    f"drift:{n['driver_version']}/{n['cuda_version']}",
                    f"driver {n['driver_version']} / CUDA {n['cuda_version']} unlike the cluster's",
                )
            )
        for condition, step, problem in found:
            decisions.append(_node_decision(rule, ev, subject, step, condition, problem, n, node_figures))
    if rule.nccl:
        for run in bad_runs:
            subject = f"nccl:{run.cluster}:{run.nodes}"
            ratio = run.busbw_ratio
            problem = (
                f"acceptance run {run.run_id} {run.status}"
                if run.status != "ok"
                else f"acceptance run {run.run_id} at {ratio * 100:.0f} % of its baseline bandwidth"
            )
            n = {
                "node": run.nodes,
                "cluster": run.cluster,
                "run_id": run.run_id,
                "collective": run.collective,
                "nodes": run.nodes,
                "run_at": run.run_at,
                "status": run.status,
                "reasons": "; ".join(run.reasons),
            }
            run_figures = {
                "avg_busbw_gbytes_per_second": run.avg_busbw_gbytes_per_second,
                "baseline_busbw_gbytes_per_second": run.baseline_busbw_gbytes_per_second,
                "busbw_ratio": ratio,
            }
            decisions.append(
                _node_decision(rule, ev, subject, f"run:{run.run_id}", "nccl", problem, n, run_figures)
            )
    return decisions


def _node_decision(
    rule: ActionRule,
    ev: Evaluation,
    subject: str,
    step: str,
    condition: str,
    problem: str,
    node: Mapping[str, Any],
    figures: dict[str, Any],
) -> Decision:
    recipients, notes = ev.recipients.resolve(rule)
    base = {
        k: None
        for k in (
            "attempts",
            "failed_attempts",
            "failed_attempts_share",
            "xid_events",
            "ecc_single_bit_errors",
            "ecc_double_bit_errors",
            "avg_busbw_gbytes_per_second",
            "baseline_busbw_gbytes_per_second",
            "busbw_ratio",
        )
    }
    base.update(figures)
    context_node = {k: safe_text(v) if isinstance(v, str) else v for k, v in node.items()}
    context_node.setdefault("majority_driver", None)
    context_node.setdefault("majority_cuda", None)
    return Decision(
        rule=rule,
        subject=subject,
        step=step,
        kind="message",
        template="node_health-alert",
        reason=f"{node['node']}: {problem}",
        evidence=jsonable({"condition": condition, "figures": base, "node": dict(node)}),
        context={"node": context_node, "figures": base, "problem": problem, "condition": condition},
        recipients=recipients,
        notes=notes,
        cluster=str(node.get("cluster") or ""),
        node=str(node["node"]),
    )


# ------------------------------------------------------------------ budgets


def budget_decisions(
    rule: ActionRule,
    ev: Evaluation,
    rows: Sequence[Any],
    taken: Mapping[tuple[str, str], Mapping[str, TakenStep]],
) -> list[Decision]:
    """Per budget row: the highest threshold its used share has passed, once a period (a lower
    one is not sent after a higher one)."""
    decisions = []
    for row in rows:
        if row.budget <= 0:
            continue
        used_share = float(row.used / row.budget)
        passed = [t for t in sorted(rule.thresholds_share) if used_share >= t]
        if not passed:
            continue
        threshold = passed[-1]
        subject = f"budget:{row.account}:{row.period}:{row.period_start_at.astimezone(UTC):%Y-%m-%d}"
        done = taken.get((rule.name, subject), {})
        if any(float(step) >= threshold for step in done):
            continue
        recipients, notes = ev.recipients.resolve(rule, account=row.account)
        record = row.record()
        figures = {name: record[name] for name in TEMPLATE_FIGURES["budget-threshold"] if name in record}
        figures["budget_used_share"] = round(used_share, 4)
        unit = row.currency if row.unit == "amount" else "GPU-hours"
        context = {
            "account": safe_text(row.account),
            "covered": ", ".join(a for a in row.covered_accounts if a != row.account),
            "period": {"kind": row.period, "start_at": row.period_start_at, "end_at": row.period_end_at},
            "unit": unit,
            "figures": figures,
            "threshold": threshold,
            "projected_exhaustion_at": row.projected_exhaustion_at,
        }
        decisions.append(
            Decision(
                rule=rule,
                subject=subject,
                step=f"{threshold:g}",
                kind="message",
                template="budget-threshold",
                reason=f"account {row.account} used {used_share * 100:.1f} % of its {row.period} budget (>= {threshold * 100:g} %)",
                evidence=jsonable(
                    {
                        "figures": figures,
                        "unit": unit,
                        "period_start_at": row.period_start_at,
                        "source": row.source,
                    }
                ),
                context=context,
                recipients=recipients,
                notes=notes,
                account=row.account,
            )
        )
    return decisions


# ------------------------------------------------------------------ closed months


def statement_decisions(
    rule: ActionRule, ev: Evaluation, statements: Sequence[Mapping[str, Any]], recorded: set[tuple[str, str]]
) -> list[Decision]:
    """Per closed month and account on its statement: the account's lines to its coordinators
    and PIs, once per closed statement (a month voided and closed again is sent again)."""
    decisions = []
    for s in statements:
        lines = s["lines"] if isinstance(s["lines"], list) else []
        by_account: dict[str, list[Mapping[str, Any]]] = {}
        for line in lines:
            by_account.setdefault(str(line.get("account", "")), []).append(line)
        step = f"closed:{s['csv_sha256'][:16]}"
        for account, account_lines in sorted(by_account.items()):
            subject = f"statement:{s['month']}:{account}"
            if (subject, step) in recorded:
                continue
            shown = []
            total_amount = Decimal(0)
            for line in account_lines:
                amount = line.get("billable_amount")
                quantity = line.get("billed_quantity")
                if amount is not None:
                    total_amount += Decimal(str(amount))
                shown.append(
                    {
                        "user": safe_text(str(line.get("user", ""))),
                        "partition": safe_text(str(line.get("partition", ""))),
                        "gpu_model": safe_text(str(line.get("gpu_model", ""))),
                        "kind": line.get("kind", "usage"),
                        # format 2 names what a line bills; a format-1 statement billed GPU-hours
                        "tres": safe_text(str(line.get("tres") or "gres/gpu")),
                        "billed_unit": safe_text(str(line.get("billed_unit") or "gpu_hour")),
                        "adjusted_month": line.get("adjusted_month") or line.get("for_month") or "",
                        "figures": {
                            "billed_quantity": Decimal(
                                str(quantity if quantity is not None else line.get("gpu_hours") or 0)
                            ),
                            "billable_amount": None if amount is None else Decimal(str(amount)),
                        },
                    }
                )
            figures = {"total_billable_amount": total_amount}
            recipients, notes = ev.recipients.resolve(rule, account=account)
            context = {
                "month": s["month"],
                "account": safe_text(account),
                "lines": shown,
                "figures": figures,
                "csv_sha256": s["csv_sha256"],
                "currency": s["currency"],
            }
            decisions.append(
                Decision(
                    rule=rule,
                    subject=subject,
                    step=step,
                    kind="message",
                    template="month_closed-statement",
                    reason=f"the statement of {s['month']} was closed ({s['closed_at']:%Y-%m-%d %H:%M %Z}); account {account}",
                    evidence=jsonable(
                        {"figures": figures, "lines": len(shown), "csv_sha256": s["csv_sha256"]}
                    ),
                    context=context,
                    recipients=recipients,
                    notes=notes,
                    account=account,
                )
            )
    return decisions


# ------------------------------------------------------------------ too many at once


def limit_decisions(rule: ActionRule, ev: Evaluation, decisions: list[Decision]) -> list[Decision]:
    """DECISIONS, or, when they act on more subjects than the rule's max_jobs_per_run, only
    their silent ones and one alert to the admins (once a UTC day)."""
    acting = [d for d in decisions if d.acts]
    subjects = list(dict.fromkeys(d.subject for d in acting))
    if not rule.max_jobs_per_run or len(subjects) <= rule.max_jobs_per_run:
        return decisions
    what = {KIND_NODE_HEALTH: "nodes", KIND_BUDGET: "accounts", KIND_MONTH_CLOSED: "accounts"}.get(
        rule.kind, "jobs"
    )
    sample = [f"{d.job_id or d.node or d.account or d.subject}: {d.reason}" for d in acting[:20]]
    for d in acting:
        ev.skip(
            rule, d.subject, d.job_id, f"not acted on: the rule would act on {len(subjects)} {what} at once"
        )
    recipients, notes = ev.recipients.resolve(rule, roles=("admins",))
    figures = {"subjects": len(subjects), "max_jobs_per_run": rule.max_jobs_per_run}
    alert = Decision(
        rule=rule,
        subject=f"rule:{rule.name}",
        step=f"too_many:{ev.now.astimezone(UTC):%Y-%m-%d}",
        kind="alert",
        template="rule-too_many",
        reason=f"rule {rule.name} would act on {len(subjects)} {what} (max_jobs_per_run {rule.max_jobs_per_run}): acted on none",
        evidence=jsonable({"figures": figures, "subjects": subjects[:200]}),
        context={"figures": figures, "what": what, "sample": [safe_text(s) for s in sample]},
        recipients=recipients,
        notes=notes,
    )
    return [d for d in decisions if not d.acts] + [alert]


def rule_context(rule: ActionRule, step: str) -> dict[str, Any]:
    return {
        "rule": {
            "name": rule.name,
            "kind": rule.kind,
            "warn_minutes": rule.warn_minutes,
            "final_warning_minutes": rule.final_warning_minutes,
            "cancel_minutes": rule.cancel_minutes,
            "cancel": rule.cancel,
            "grace_minutes": rule.grace_minutes,
            "gpus": rule.gpus,
            "lookback_hours": rule.lookback_hours,
        },
        "step": step,
    }


__all__ = [
    "GPU_KINDS",
    "KIND_IDLE",
    "KIND_JOB_END",
    "Decision",
    "Evaluation",
    "Skip",
    "budget_decisions",
    "gpu_rule_decisions",
    "job_end_decisions",
    "limit_decisions",
    "node_health_decisions",
    "statement_decisions",
]
