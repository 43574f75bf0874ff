"""One round of acting: evaluate every rule, record what they decide, deliver what is due.

run_cycle is what the daemon runs after each attribution run (slurmtel.scheduler) and what
`slurmtel act` runs by hand; `slurmtel act --dry-run` runs the same evaluation in a transaction
it rolls back, and delivers nothing.

One process at a time: the actions lease is a PostgreSQL session advisory lock
(slurmtel.store.locks.ACTIONS_LEASE_KEY) held on a connection of its own for the whole round.
A second daemon started by mistake finds it held and does nothing (it says by whom); a process
killed with -9 loses its connection and with it the lease, at once. The lease holder first
settles what a dead holder left: a delivery in `sending` goes back to pending (nothing the
receiver would act on had left), one in `committing` becomes uncertain (slurmtel.actions.deliver).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from slurmtel.access import EVERYTHING
from slurmtel.actions import deliver as channels
from slurmtel.actions.metrics import ActionMetrics, GaugeSnapshot
from slurmtel.actions.recipients import Recipients
from slurmtel.actions.render import Renderer
from slurmtel.actions.rules import (
    Decision,
    Evaluation,
    Skip,
    budget_decisions,
    gpu_rule_decisions,
    gpu_stretches,
    job_end_decisions,
    job_link,
    limit_decisions,
    matched_gpus,
    node_health_decisions,
    rule_context,
    statement_decisions,
)
from slurmtel.actions.settings import (
    GPU_KINDS,
    KIND_BUDGET,
    KIND_JOB_END,
    KIND_MONTH_CLOSED,
    KIND_NODE_HEALTH,
    ActionRule,
)
from slurmtel.config import Config
from slurmtel.logs import log_event
from slurmtel.store import actions as store
from slurmtel.store.actions import Delivery, FoldStats, RunningAttempt
from slurmtel.store.locks import (
    ACTIONS_LEASE_KEY,
    release_session_lock,
    session_lock_holder,
    try_session_lock,
)

log = logging.getLogger(__name__)

# statements closed this long ago are still sent (a daemon that was down for a while)
STATEMENT_LOOKBACK = timedelta(days=40)
# a rule with only_when_asked = false looks at jobs that ended this long ago at most
JOB_END_LOOKBACK = timedelta(days=1)


@dataclass
class DeliveryOutcome:
    delivery_id: int
    action_id: int
    rule: str
    step: str
    channel: str
    target: str
    state: str
    detail: str


@dataclass
class CycleReport:
    now: datetime
    dry_run: bool
    # who holds the lease when this process could not take it (then nothing was done)
    lease_held_by: str | None = None
    fold: FoldStats = field(default_factory=lambda: FoldStats(0, 0, 0))
    decisions: list[Decision] = field(default_factory=list)
    recorded: int = 0
    skipped: list[Skip] = field(default_factory=list)
    deliveries: list[DeliveryOutcome] = field(default_factory=list)
    # what a dry run would try to deliver now (earlier decisions' pending deliveries)
    due: list[Delivery] = field(default_factory=list)
    rendered: dict[int, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    recovered: dict[str, int] = field(default_factory=dict)
    # seconds of each part of the evaluation
    timings: dict[str, float] = field(default_factory=dict)
    evaluation_seconds: float = 0.0
    seconds: float = 0.0
    running_jobs: int = 0


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def active_rules(config: Config) -> list[ActionRule]:
    return [r for r in config.actions.rules if r.enabled]


# ------------------------------------------------------------------ evaluation


def evaluate(
    conn: Any,
    config: Config,
    *,
    now: datetime,
    recipients: Recipients | None = None,
    metrics: ActionMetrics | None = None,
    errors: list[str] | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[list[Decision], list[Skip], FoldStats, list[RunningAttempt], GaugeSnapshot]:
    """Every enabled rule's decisions now (CONN: a transaction; the idle stretches are folded
    forward in it). TIMINGS gets the seconds of each part (the fold, each rule, ...)."""
    errors = errors if errors is not None else []
    timings = timings if timings is not None else {}
    mark = time.perf_counter()

    def took(part: str) -> None:
        nonlocal mark
        now_mark = time.perf_counter()
        timings[part] = timings.get(part, 0.0) + now_mark - mark
        mark = now_mark

    rules = active_rules(config)
    actions = config.actions
    exclusions = {e.user: e for e in store.exclusions(conn, now=now)}
    ev = Evaluation(config, now, recipients or Recipients(config), exclusions)
    gpu_rules = [r for r in rules if r.kind in GPU_KINDS]
    longest = max(
        (max(r.warn_minutes, r.final_warning_minutes, r.cancel_minutes) for r in gpu_rules), default=0
    )
    fold = store.fold_streaks(
        conn,
        now=now,
        idle_memory_max_bytes=actions.idle_memory_max_bytes,
        horizon_seconds=longest * 60 + actions.telemetry_max_age_seconds + 3600,
    )
    took("fold")
    attempts = store.running_gpus(
        conn,
        now=now,
        fresh_after=now - timedelta(seconds=actions.telemetry_max_age_seconds),
        running_states=config.outcomes.running,
    )
    took("running jobs")
    decisions: list[Decision] = []

    def run(rule: ActionRule, work: Callable[[], list[Decision]]) -> None:
        try:
            decided = work()
        except Exception as exc:  # one rule never stops the others
            errors.append(f"rule {rule.name}: {type(exc).__name__}: {exc}")
            log_event(
                log,
                "action_rule_failed",
                logging.ERROR,
                rule=rule.name,
                message=f"{type(exc).__name__}: {exc}",
            )
            log.debug("rule %s failed", rule.name, exc_info=True)
            if metrics is not None:
                metrics.rule_errors.labels(rule=rule.name).inc()
            return
        limited = limit_decisions(rule, ev, decided)
        if metrics is not None and any(d.kind == "alert" for d in limited):
            metrics.suppressed.labels(rule=rule.name).inc()
        decisions.extend(limited)
        took(f"rule {rule.name}")

    subjects = [
        f"job:{a.cluster}:{a.job_id_raw}:{a.submit_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}" for a in attempts
    ]
    taken = store.taken_steps(conn, [r.name for r in gpu_rules], subjects)
    took("steps taken")
    for rule in gpu_rules:
        run(rule, lambda rule=rule: gpu_rule_decisions(rule, attempts, taken, ev))  # type: ignore[misc]
    for rule in rules:
        if rule.kind == KIND_JOB_END:
            run(rule, lambda rule=rule: _job_end(conn, rule, ev))  # type: ignore[misc]
        elif rule.kind == KIND_NODE_HEALTH:
            run(rule, lambda rule=rule: _node_health(conn, rule, ev))  # type: ignore[misc]
        elif rule.kind == KIND_BUDGET:
            run(rule, lambda rule=rule: _budgets(conn, rule, ev))  # type: ignore[misc]
        elif rule.kind == KIND_MONTH_CLOSED:
            run(rule, lambda rule=rule: _statements(conn, rule, ev))  # type: ignore[misc]
    snapshot = _snapshot(conn, ev, attempts)
    took("gauges")
    return decisions, ev.skipped, fold, attempts, snapshot


def _job_end(conn: Any, rule: ActionRule, ev: Evaluation) -> list[Decision]:
    requests = store.open_mail_requests(conn) if rule.only_when_asked else []
    ended = (
        []
        if rule.only_when_asked
        else store.recently_ended(conn, since=ev.now - JOB_END_LOOKBACK, until=ev.now)
    )
    from slurmtel.actions.rules import job_subject

    subjects = [
        job_subject(j.cluster, j.job_id_raw, j.submit_at)
        for j in (*requests, *ended)
        if j.job_id_raw is not None and j.submit_at is not None
    ]
    recorded = store.recorded_subjects(conn, rule.name, subjects)
    return job_end_decisions(rule, conn, ev, requests, ended, recorded)


def _node_health(conn: Any, rule: ActionRule, ev: Evaluation) -> list[Decision]:
    from slurmtel.store.reports_fabric import fabric_report
    from slurmtel.store.reports_nodes import nodes_report

    since = ev.now - timedelta(hours=rule.lookback_hours)
    nodes = nodes_report(conn, start=since, end=ev.now, now=ev.now, scope=EVERYTHING)
    latest: dict[str, dict[str, datetime]] = {}
    for node, kind, _, newest in store.gpu_events_since(conn, since):
        latest.setdefault(node, {})[kind] = newest
    bad_runs = []
    if rule.nccl:
        fabric = ev.config.fabric
        report = fabric_report(
            conn,
            start=since,
            end=ev.now,
            scope=EVERYTHING,
            baseline_fraction=fabric.baseline_fraction,
            baseline_runs=fabric.baseline_runs,
        )
        bad_runs = [run for run in report.runs if run.bad]
    decisions = node_health_decisions(rule, ev, nodes, latest, bad_runs, store.newest_failures(conn, since))
    recorded = store.recorded_subjects(conn, rule.name, [d.subject for d in decisions])
    return [d for d in decisions if (d.subject, d.step) not in recorded]


def _budgets(conn: Any, rule: ActionRule, ev: Evaluation) -> list[Decision]:
    from slurmtel.budget import configured_budgets, merge_budgets, slurm_budgets
    from slurmtel.commands.budget import budget_rows, read_account_parents, read_slurm_budgets

    config = ev.config
    chargeback = config.chargeback
    warnings: list[str] = []
    budgets = configured_budgets(chargeback, ev.now, config.zone)
    if chargeback.budgets_from_slurm:
        budgets = merge_budgets(
            budgets, slurm_budgets(read_slurm_budgets(config, warnings), chargeback.budget_slurm_period)
        )
    if not budgets:
        return []
    rows = budget_rows(conn, config, budgets, read_account_parents(config, warnings), ev.now, EVERYTHING)
    for line in warnings:
        log_event(log, "action_budget_input", logging.WARNING, rule=rule.name, message=line)
    subjects = [f"budget:{r.account}:{r.period}:{r.period_start_at.astimezone(UTC):%Y-%m-%d}" for r in rows]
    taken = store.taken_steps(conn, [rule.name], subjects)
    return budget_decisions(rule, ev, rows, taken)


def _statements(conn: Any, rule: ActionRule, ev: Evaluation) -> list[Decision]:
    statements = store.statements_closed_since(conn, ev.now - STATEMENT_LOOKBACK)
    subjects = [
        f"statement:{s['month']}:{line.get('account', '')}" for s in statements for line in (s["lines"] or [])
    ]
    recorded = store.recorded_subjects(conn, rule.name, list(dict.fromkeys(subjects)))
    return statement_decisions(rule, ev, statements, recorded)


def _snapshot(conn: Any, ev: Evaluation, attempts: list[RunningAttempt]) -> GaugeSnapshot:
    from slurmtel.actions.settings import KIND_IDLE, KIND_NO_PROCESS

    snapshot = GaugeSnapshot()
    for a in attempts:
        key = (a.cluster, a.job_id, a.partition)
        idle = [s for s in ev.stretches(KIND_IDLE, a) if s.length_seconds]
        no_process = [s for s in ev.stretches(KIND_NO_PROCESS, a) if s.length_seconds]
        for s in idle:
            snapshot.node_idle_gpus[s.node] = snapshot.node_idle_gpus.get(s.node, 0) + 1
        for s in no_process:
            snapshot.node_no_process_gpus[s.node] = snapshot.node_no_process_gpus.get(s.node, 0) + 1
        if idle:
            snapshot.job_idle_gpus[key] = len(idle)
            snapshot.job_idle_seconds[key] = max(s.length_seconds or 0.0 for s in idle)
    for node, kind, count, _ in store.gpu_events_since(conn, ev.now - timedelta(hours=24)):
        snapshot.node_events[(node, kind)] = count
    return snapshot


# ------------------------------------------------------------------ recording


def render(renderer: Renderer, config: Config, decision: Decision) -> Any:
    context: dict[str, Any] = {"link": "", "currency": config.chargeback.currency}
    if decision.job_id:
        context["link"] = job_link(config, decision.job_id)
    context.update(rule_context(decision.rule, decision.step))
    context.update(decision.context)
    return renderer.render(decision.template, context)


def deliveries_of(decision: Decision) -> tuple[tuple[str, str, str], ...]:
    if decision.silent:
        return ()
    found: list[tuple[str, str, str]] = []
    if decision.kind == "cancel":
        found.append(("scancel", str(decision.job_id_raw), ""))
    found.extend(("email", address, role) for address, role in decision.recipients)
    found.extend(("webhook", name, "") for name in decision.webhooks)
    return tuple(found)


def record(
    conn: Any,
    config: Config,
    decisions: list[Decision],
    *,
    now: datetime,
    decided_by: str,
    renderer: Renderer,
    metrics: ActionMetrics | None = None,
    errors: list[str] | None = None,
) -> int:
    """Write DECISIONS (each once: a decision recorded before is left as it is). A decision
    whose message cannot be rendered (a site template's error) is left out, and said in ERRORS."""
    recorded = 0
    for d in decisions:
        if d.template:
            try:
                message = render(renderer, config, d)
            except Exception as exc:
                _template_error(d, exc, errors, metrics)
                continue
            deliveries = deliveries_of(d)
            reason = d.reason
            if d.notes:
                reason += "; " + "; ".join(d.notes)
            if not deliveries and not d.silent:
                reason += "; nobody to tell: nothing sent"
            action_id = store.insert_action(
                conn,
                store.NewAction(
                    rule=d.rule.name,
                    rule_kind=d.rule.kind,
                    subject=d.subject,
                    step=d.step,
                    kind=d.kind,
                    decided_at=now,
                    decided_by=decided_by,
                    reason=reason,
                    evidence=d.evidence,
                    title=message.title,
                    body_text=message.text,
                    body_html=message.html,
                    cluster=d.cluster,
                    job_id_raw=d.job_id_raw,
                    submit_at=d.submit_at,
                    job_id=d.job_id,
                    user=d.user,
                    account=d.account,
                    node=d.node,
                    deliveries=deliveries,
                    status="skipped",
                ),
            )
            if action_id is not None:
                recorded += 1
                if metrics is not None:
                    metrics.decided.labels(rule=d.rule.name, kind=d.kind).inc()
                log_event(
                    log,
                    "action_decided",
                    rule=d.rule.name,
                    step=d.step,
                    kind=d.kind,
                    subject=d.subject,
                    action_id=action_id,
                    deliveries=len(deliveries),
                )
        store.mark_requests_handled(conn, d.request_ids, now=now)
    return recorded


def _template_error(
    d: Decision, exc: Exception, errors: list[str] | None, metrics: ActionMetrics | None
) -> None:
    message = f"rule {d.rule.name}: template {d.template}: {type(exc).__name__}: {exc}"
    if errors is not None:
        errors.append(message)
    if metrics is not None:
        metrics.rule_errors.labels(rule=d.rule.name).inc()
    log_event(
        log, "action_template_failed", logging.ERROR, rule=d.rule.name, template=d.template, message=message
    )


# ------------------------------------------------------------------ delivery


def recover_orphans(engine: Engine) -> dict[str, int]:
    """What a holder that died left (only the lease holder calls this)."""
    counts = {"resent": 0, "uncertain": 0}
    with engine.begin() as conn:
        for d in store.orphaned_deliveries(conn):
            if d.state == "sending" or d.channel == "scancel":
                # nothing the receiver acts on had left (a scancel is re-checked and is harmless twice)
                store.set_delivery_state(
                    conn,
                    d.id,
                    from_states=("sending", "committing"),
                    state="pending",
                    error="the process sending it stopped before the point of no return",
                )
                counts["resent"] += 1
            else:
                store.set_delivery_state(
                    conn,
                    d.id,
                    from_states=("committing",),
                    state="uncertain",
                    error="the process stopped waiting for the receiver's answer: "
                    "it may have been delivered; not sent again",
                )
                counts["uncertain"] += 1
            store.refresh_action_status(conn, d.action_id)
    if any(counts.values()):
        log_event(log, "action_deliveries_recovered", logging.WARNING, **counts)
    return counts


def backoff(config: Config, tries: int) -> timedelta:
    a = config.actions
    return timedelta(
        seconds=min(a.retry_backoff_max_seconds, a.retry_backoff_seconds * 2 ** max(0, tries - 1))
    )


class Deliverer:
    """Delivers due deliveries one by one, each state change committed on its own."""

    def __init__(
        self,
        engine: Engine,
        config: Config,
        *,
        clock: Callable[[], datetime],
        holder: str,
        metrics: ActionMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.clock = clock
        self.holder = holder
        self.metrics = metrics
        self.domain = channels.make_msgid_domain()
        # what could not be reached this round ("email", "webhook:NAME"): its other deliveries
        # wait for the next round instead of each waiting for its timeout
        self.unreachable: set[str] = set()

    def run(self, limit: int = 1000) -> list[DeliveryOutcome]:
        outcomes: list[DeliveryOutcome] = []
        # a cancel's e-mail becomes due once its scancel is done: a second pass picks it up
        for _ in range(2):
            with self.engine.connect() as conn:
                due = store.due_deliveries(conn, now=self.clock(), limit=limit)
            if not due:
                break
            for d in due:
                outcome = self.deliver(d)
                if outcome is not None:
                    outcomes.append(outcome)
        return outcomes

    def _set(self, d: Delivery, **changes: Any) -> bool:
        with self.engine.begin() as conn:
            done = store.set_delivery_state(conn, d.id, **changes)
            store.refresh_action_status(conn, d.action_id)
        return done

    @staticmethod
    def _endpoint(d: Delivery) -> str:
        return d.channel if d.channel != "webhook" else f"webhook:{d.target}"

    def deliver(self, d: Delivery) -> DeliveryOutcome | None:
        if self._endpoint(d) in self.unreachable:
            return None
        msgid = d.message_id or channels.message_id(d.id, self.domain)
        with self.engine.begin() as conn:
            if not store.claim_delivery(conn, d.id, holder=self.holder, message_id=msgid, now=self.clock()):
                return None
        tries = d.tries + 1

        def point_of_no_return() -> None:
            if not self._set(d, from_states=("sending",), state="committing"):
                raise channels.DeliveryError("the delivery was taken from this process", permanent=True)

        try:
            if d.channel == "email":
                result = self._email(d, msgid, point_of_no_return)
            elif d.channel == "webhook":
                result = self._webhook(d, msgid, point_of_no_return)
            elif d.channel == "scancel":
                result = self._scancel(d)
            else:
                raise channels.DeliveryError(f"unknown channel {d.channel}", permanent=True)
        except channels.NotDone as exc:
            self._set(d, from_states=("sending",), state="not_done", result=str(exc), sent_at=self.clock())
            self._cancel_not_done(d)
            return self._outcome(d, "not_done", str(exc))
        except channels.DeliveryError as exc:
            message = str(exc)
            if exc.unreachable:
                self.unreachable.add(self._endpoint(d))
            if exc.uncertain:
                state = "uncertain"
                self._set(d, from_states=("committing",), state=state, error=message)
            elif exc.permanent or tries >= self.config.actions.retry_max_attempts:
                state = "failed"
                self._set(d, from_states=("sending", "committing"), state=state, error=message)
                if d.channel == "scancel":
                    self._cancel_not_done(d)
            else:
                state = "retry"
                self._set(
                    d,
                    from_states=("sending", "committing"),
                    state="pending",
                    error=message,
                    next_try_at=self.clock() + backoff(self.config, tries),
                )
            log_event(
                log,
                "action_delivery",
                logging.WARNING,
                delivery_id=d.id,
                action_id=d.action_id,
                rule=d.rule,
                channel=d.channel,
                result=state,
                tries=tries,
                message=message,
            )
            return self._outcome(d, state, message)
        self._set(d, from_states=("sending", "committing"), state="sent", result=result, sent_at=self.clock())
        log_event(
            log,
            "action_delivery",
            delivery_id=d.id,
            action_id=d.action_id,
            rule=d.rule,
            channel=d.channel,
            result="sent",
            tries=tries,
        )
        return self._outcome(d, "sent", result)

    def _cancel_not_done(self, d: Delivery) -> None:
        """The messages of a cancel that was not done say the job was cancelled: not sent."""
        with self.engine.begin() as conn:
            for other in store.action_deliveries(conn, d.action_id):
                if other.id != d.id and other.state == "pending":
                    store.set_delivery_state(
                        conn,
                        other.id,
                        from_states=("pending",),
                        state="not_done",
                        result="the cancel was not done",
                    )
            store.refresh_action_status(conn, d.action_id)

    def _outcome(self, d: Delivery, state: str, detail: str) -> DeliveryOutcome:
        if self.metrics is not None:
            self.metrics.deliveries.labels(channel=d.channel, result=state).inc()
        return DeliveryOutcome(d.id, d.action_id, d.rule, d.step, d.channel, d.target, state, detail)

    def _email(self, d: Delivery, msgid: str, point_of_no_return: Callable[[], None]) -> str:
        settings = self.config.actions.email
        message = channels.build_email(
            settings,
            to=d.target,
            title=d.title,
            text=d.body_text,
            html=d.body_html,
            msgid=msgid,
            headers={
                "X-Slurmtel-Rule": d.rule,
                "X-Slurmtel-Step": d.step,
                "X-Slurmtel-Action": str(d.action_id),
            },
        )
        return channels.send_email(settings, message, d.target, point_of_no_return)

    def _webhook(self, d: Delivery, msgid: str, point_of_no_return: Callable[[], None]) -> str:
        hooks = {h.name: h for h in self.config.actions.webhooks}
        hook = hooks.get(d.target)
        if hook is None:
            raise channels.DeliveryError(
                f"no [[actions.webhooks]] is named '{d.target}' any more", permanent=True
            )
        record = {
            "action_id": d.action_id,
            "rule": d.rule,
            "rule_kind": d.rule_kind,
            "step": d.step,
            "kind": d.kind,
            "subject": d.subject,
            "cluster": d.cluster,
            "job_id": d.job_id,
            "user": d.user,
            "account": d.account,
            "node": d.node,
            "decided_at": d.decided_at.isoformat(),
            "reason": d.reason,
            "evidence": d.evidence,
            "title": d.title,
            "text": d.body_text,
        }
        return channels.send_webhook(
            hook, channels.webhook_payload(hook, record), msgid.strip("<>"), point_of_no_return
        )

    def _scancel(self, d: Delivery) -> str:
        """The re-check, then scancel (the job id the rule matched)."""
        recheck = recheck_cancel(self.engine, self.config, d, now=self.clock())
        actions = self.config.actions
        result = channels.run_scancel(
            actions.scancel_command,
            d.target,
            cluster_args(self.config, d.cluster),
            actions.command_timeout_seconds,
        )
        return f"{recheck}; {result}"


def cluster_args(config: Config, cluster: str) -> list[str]:
    """-M CLUSTER where slurmtel collects several clusters (scancel and squeue default to their own)."""
    return ["-M", cluster] if config.sources.sacct.clusters and cluster else []


def recheck_cancel(engine: Engine, config: Config, d: Delivery, *, now: datetime) -> str:
    """Raise NotDone unless the job may be cancelled now: the rule still cancels, the user is
    not excluded, squeue says RUNNING, and its GPUs' own windows (not the folded stretches)
    still show the condition for cancel_minutes. Returns what was checked."""
    rules = {r.name: r for r in active_rules(config)}
    rule = rules.get(d.rule)
    if rule is None or not rule.cancel or not rule.cancel_minutes:
        raise channels.NotDone(f"rule {d.rule} no longer cancels (config changed)")
    with engine.connect() as conn:
        excluded = [e for e in store.exclusions(conn, now=now) if e.user == d.user]
    if excluded:
        raise channels.NotDone(f"user {d.user} was put on the exclusion list ({excluded[0].reason})")
    actions = config.actions
    state = channels.job_state(
        config.sources.slurmctld.squeue_command,
        d.target,
        cluster_args(config, d.cluster),
        actions.command_timeout_seconds,
    )
    if state != "RUNNING":
        earlier = " (an earlier try of this scancel may have ended it)" if d.tries else ""
        raise channels.NotDone(f"job {d.job_id} is {state or 'no longer in squeue'} now{earlier}")
    job = d.evidence.get("job", {})
    gpus = [g for g in d.evidence.get("gpus", []) if g.get("gpu_uuid")]
    start_at = datetime.fromisoformat(job["start_at"])
    seconds = rule.cancel_minutes * 60
    with engine.connect() as conn:
        windows = store.gpu_stretches_now(
            conn,
            [g["gpu_uuid"] for g in gpus],
            start=now - timedelta(seconds=seconds + actions.telemetry_max_age_seconds + 3600),
            end=now,
            idle_memory_max_bytes=actions.idle_memory_max_bytes,
        )
    from slurmtel.store.actions import RunningAttempt, RunningGpu

    attempt = RunningAttempt(
        cluster=d.cluster,
        job_id_raw=d.job_id_raw or 0,
        submit_at=d.submit_at or now,
        job_id=d.job_id,
        name="",
        user=d.user,
        account=d.account,
        partition="",
        qos="",
        state=state,
        start_at=start_at,
        time_limit_seconds=None,
        alloc_gpus=int(d.evidence.get("figures", {}).get("gpus") or len(gpus)),
        gpu_model="",
        submit_line="",
        nodes=(),
        billing=0,
        gpus=[
            RunningGpu(
                node=g.get("node", ""),
                gpu_uuid=g["gpu_uuid"],
                gpu_index=None,
                mapping="",
                source="recheck",
                last_window_end_at=windows.get(g["gpu_uuid"], {}).get("last_window_end_at"),
                idle_since_at=windows.get(g["gpu_uuid"], {}).get("idle_since_at"),
                no_process_since_at=windows.get(g["gpu_uuid"], {}).get("no_process_since_at"),
                idle_util_max_percent=windows.get(g["gpu_uuid"], {}).get("idle_util_max_percent"),
                idle_memory_used_max_bytes=windows.get(g["gpu_uuid"], {}).get("idle_memory_used_max_bytes"),
            )
            for g in gpus
        ],
    )
    stretches = gpu_stretches(rule.kind, attempt, now, actions.telemetry_max_age_seconds)
    matched = matched_gpus(rule, attempt, stretches, seconds)
    if not matched:
        shown = ", ".join(
            f"{g.get('gpu', s.gpu_uuid)} {'not measured now' if s.length_seconds is None else f'{s.length_seconds / 60:.0f} min'}"
            for g, s in zip(gpus, stretches, strict=True)
        )
        raise channels.NotDone(f"re-check at {now:%H:%M:%S %Z}: the GPUs no longer meet the rule ({shown})")
    shortest = min(s.length_seconds or 0.0 for s in matched)
    return f"re-checked at {now:%Y-%m-%d %H:%M:%S %Z}: {state}, {len(matched)} of {attempt.alloc_gpus} GPUs for {shortest / 60:.0f} min"


# ------------------------------------------------------------------ the round


def run_cycle(
    engine: Engine,
    config: Config,
    *,
    now: datetime,
    dry_run: bool = False,
    decided_by: str | None = None,
    metrics: ActionMetrics | None = None,
    clock: Callable[[], datetime] | None = None,
    recipients: Recipients | None = None,
    deliver: bool = True,
) -> CycleReport:
    """Evaluate, record and deliver (see the module's docstring); with DRY_RUN only evaluate,
    in a transaction rolled back, and say what would be delivered."""
    t0 = time.monotonic()
    report = CycleReport(now=now, dry_run=dry_run)
    renderer = Renderer(config.actions.templates_dir, config.zone)
    clock = clock or (lambda: datetime.now(UTC))
    holder = process_name()
    if dry_run:
        with engine.connect() as conn:
            transaction = conn.begin()
            try:
                t1 = time.monotonic()
                decisions, skipped, report.fold, attempts, _ = evaluate(
                    conn, config, now=now, recipients=recipients, errors=report.errors, timings=report.timings
                )
                report.evaluation_seconds = time.monotonic() - t1
                report.decisions, report.skipped, report.running_jobs = decisions, skipped, len(attempts)
                for i, d in enumerate(decisions):
                    if d.template:
                        try:
                            report.rendered[i] = render(renderer, config, d)
                        except Exception as exc:
                            _template_error(d, exc, report.errors, None)
                report.due = store.due_deliveries(conn, now=now)
            finally:
                transaction.rollback()
        report.seconds = time.monotonic() - t0
        return report
    with engine.connect() as lease:
        if not try_session_lock(lease, ACTIONS_LEASE_KEY):
            report.lease_held_by = session_lock_holder(lease, ACTIONS_LEASE_KEY) or "another process"
            lease.rollback()
            if metrics is not None:
                metrics.runs.labels(status="lease_held").inc()
            log_event(log, "actions_lease_held", logging.WARNING, held_by=report.lease_held_by)
            report.seconds = time.monotonic() - t0
            return report
        lease.commit()
        try:
            report.recovered = recover_orphans(engine)
            with engine.begin() as conn:
                t1 = time.monotonic()
                decisions, skipped, report.fold, attempts, snapshot = evaluate(
                    conn,
                    config,
                    now=now,
                    recipients=recipients,
                    metrics=metrics,
                    errors=report.errors,
                    timings=report.timings,
                )
                report.evaluation_seconds = time.monotonic() - t1
                report.decisions, report.skipped, report.running_jobs = decisions, skipped, len(attempts)
                report.recorded = record(
                    conn,
                    config,
                    decisions,
                    now=now,
                    decided_by=decided_by or f"slurmtel on {holder}",
                    renderer=renderer,
                    metrics=metrics,
                    errors=report.errors,
                )
            if metrics is not None:
                metrics.set_snapshot(snapshot)
                metrics.evaluation_duration.set(report.evaluation_seconds)
            if deliver:
                report.deliveries = Deliverer(
                    engine, config, clock=clock, holder=holder, metrics=metrics
                ).run()
            if metrics is not None:
                with engine.connect() as conn:
                    counts = store.pending_delivery_count(conn)
                for state in ("pending", "failed", "uncertain"):
                    metrics.open_deliveries.labels(state=state).set(counts.get(state, 0))
        except Exception:
            if metrics is not None:
                metrics.runs.labels(status="error").inc()
            raise
        finally:
            try:
                release_session_lock(lease, ACTIONS_LEASE_KEY)
                lease.commit()
            except Exception:
                # a pooled connection must never keep the lease: closing the session frees it
                lease.invalidate()
                raise
    report.seconds = time.monotonic() - t0
    if metrics is not None:
        metrics.runs.labels(status="ok").inc()
        metrics.duration.set(report.seconds)
        metrics.last_success.set(time.time())
    log_event(
        log,
        "actions_run",
        decided=report.recorded,
        delivered=sum(o.state == "sent" for o in report.deliveries),
        failed=sum(o.state in ("failed", "retry") for o in report.deliveries),
        skipped=len(report.skipped),
        running_jobs=report.running_jobs,
        rule_errors=len(report.errors),
        seconds=round(report.seconds, 3),
    )
    return report
