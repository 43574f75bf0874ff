"""`slurmtel act`: the rules of [actions] by hand (the daemon runs them after each attribution
run), their record, the exclusion list; and `slurmtel mailprog`, Slurm's MailProg.

- `act --dry-run`: what the rules would send or do now, with the evidence; nothing is
  recorded or sent (the evaluation runs in a transaction that is rolled back);
- `act`: evaluate, record and deliver now (what the daemon does), under the actions lease;
- `act log`: the record, scoped like every view (a user sees the actions on their own jobs);
- `act exclude USER --for 7d --reason TEXT` / `act include USER` / `act exclude --list`:
  the time-limited exclusion list (admins), recorded with who and why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import datetime, timedelta
from typing import Any

from slurmtel.access import Action
from slurmtel.commands import common
from slurmtel.commands.argtypes import positive_int
from slurmtel.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    add_format_argument,
    add_window_arguments,
    open_context,
    resolve_window,
    scope_for,
)
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import escape_controls, render

LOG_COLUMNS = (
    "decided_at",
    "rule",
    "step",
    "kind",
    "status",
    "job_id",
    "user",
    "account",
    "node",
    "sent_to",
    "reason",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    act = commands.add_parser(
        "act",
        help="the [actions] rules now: --dry-run shows what they would send or do, with the evidence",
        description=(
            "Evaluate the [actions] rules now, record what they decide and deliver it (what the "
            "daemon does after each attribution run). With --dry-run nothing is recorded or sent."
        ),
    )
    act.add_argument("--dry-run", action="store_true", help="show what would be sent or done now; do nothing")
    act.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (json: the messages too)"
    )
    sub = act.add_subparsers(title="subcommands", metavar="SUBCOMMAND", dest="act_command")
    log = sub.add_parser("log", help="the record of every message and action (scoped: your own jobs')")
    add_window_arguments(log, "30 days ago")
    log.add_argument("-u", "--user", default=None, help="only this user's")
    log.add_argument("-j", "--job", default=None, help="only this job id's")
    log.add_argument("--rule", default=None, help="only this rule's")
    log.add_argument("--limit", type=positive_int, default=100, help="at most this many (default 100)")
    add_format_argument(log)
    log.set_defaults(handler=cmd_log)
    exclude = sub.add_parser("exclude", help="put a user on the exclusion list for a while (admins)")
    exclude.add_argument("user", nargs="?", metavar="USER")
    when = exclude.add_mutually_exclusive_group()
    when.add_argument("--for", dest="duration", default=None, help="how long: 30m, 12h, 7d, 2w")
    when.add_argument("--until", default=None, help="until this time (sacct's forms, site.timezone)")
    exclude.add_argument("--reason", default=None, help="why (recorded)")
    exclude.add_argument("--list", action="store_true", help="list the exclusions (in force, and past ones)")
    exclude.set_defaults(handler=cmd_exclude)
    include = sub.add_parser("include", help="take a user off the exclusion list now (admins)")
    include.add_argument("user", metavar="USER")
    include.set_defaults(handler=cmd_include)
    act.set_defaults(handler=cmd_act)

    mailprog = commands.add_parser(
        "mailprog",
        help="Slurm's MailProg: job-end mails become slurmtel's job summaries, others pass through",
        description=(
            "Called by slurmctld as MailProg (through systemd/slurmtel-mailprog.sh): a job-end mail "
            "becomes a request for the job's summary (the job_end rule); every other mail goes to "
            "actions.mailprog.fallback_command unchanged."
        ),
    )
    mailprog.add_argument("-s", dest="subject", default="", help="the subject Slurm gives")
    mailprog.add_argument("recipients", nargs="*", metavar="RECIPIENT")
    mailprog.set_defaults(handler=cmd_mailprog)


# ------------------------------------------------------------------ act


def cmd_act(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.actions.cycle import run_cycle

    scope_for(config, Action.MANAGE_ACTIONS)  # admins: it sends and cancels
    ctx = open_context(config)
    now = ctx.clock()
    who = common.current_identity(config).user
    report = run_cycle(
        ctx.engine,
        config,
        now=now,
        dry_run=args.dry_run,
        decided_by=f"slurmtel act by {who} ({os.getpid()})",
        clock=ctx.clock,
    )
    if report.lease_held_by:
        print(f"slurmtel: the actions lease is held by {report.lease_held_by}: nothing done", file=sys.stderr)
        return EXIT_ERROR
    if args.format == "json":
        json.dump(report_document(report), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        write_report(report, sys.stdout)
    for error in report.errors:
        print(f"slurmtel: {error}", file=sys.stderr)
    return EXIT_ERROR if report.errors else EXIT_OK


def report_document(report: Any) -> dict[str, Any]:
    return {
        "now": report.now,
        "dry_run": report.dry_run,
        "folded": {"batches": report.fold.batches, "windows": report.fold.windows, "gpus": report.fold.gpus},
        "running_jobs": report.running_jobs,
        "decisions": [
            {
                "rule": d.rule.name,
                "kind": d.kind,
                "step": d.step,
                "subject": d.subject,
                "job_id": d.job_id,
                "user": d.user,
                "account": d.account,
                "node": d.node,
                "reason": d.reason,
                "notes": d.notes,
                "recipients": [{"address": a, "role": r} for a, r in d.recipients],
                "webhooks": d.webhooks,
                "silent": d.silent,
                "evidence": d.evidence,
                **(
                    {
                        "title": report.rendered[i].title,
                        "text": report.rendered[i].text,
                        "html": report.rendered[i].html,
                    }
                    if i in report.rendered
                    else {}
                ),
            }
            for i, d in enumerate(report.decisions)
            if d.template
        ],
        "skipped": [
            {"rule": s.rule, "subject": s.subject, "job_id": s.job_id, "reason": s.reason}
            for s in report.skipped
        ],
        "due": [
            {
                "delivery_id": d.id,
                "rule": d.rule,
                "step": d.step,
                "channel": d.channel,
                "target": d.target,
                "tries": d.tries,
            }
            for d in report.due
        ],
        "deliveries": [
            {
                "delivery_id": o.delivery_id,
                "action_id": o.action_id,
                "rule": o.rule,
                "step": o.step,
                "channel": o.channel,
                "target": o.target,
                "state": o.state,
                "detail": o.detail,
            }
            for o in report.deliveries
        ],
        "recorded": report.recorded,
        "errors": report.errors,
        "evaluation_seconds": round(report.evaluation_seconds, 3),
    }


def _minutes(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) / 60:.0f} min"


def write_report(report: Any, out: Any) -> None:
    zone_now = report.now
    head = "dry run: nothing recorded or sent" if report.dry_run else f"{report.recorded} recorded"
    out.write(f"Actions at {zone_now:%Y-%m-%d %H:%M:%S %Z} ({head})\n")
    out.write(
        f"  idle stretches: {report.fold.batches} new telemetry batches folded ({report.fold.windows} windows); "
        f"{report.running_jobs} running jobs with GPUs\n"
    )
    verb = "would" if report.dry_run else "decided:"
    # (a MailProg request whose summary was decided before is only marked answered)
    shown = [(i, d) for i, d in enumerate(report.decisions) if d.template]
    if not shown:
        out.write("  no rule has anything to do now\n")
    for i, d in shown:
        what = {"message": "send", "cancel": "cancel the job and tell", "alert": "alert"}.get(d.kind, d.kind)
        target = (d.job_id and f"job {d.job_id} ({d.user})") or d.node or d.account or d.subject
        out.write(escape_controls(f"\n{d.rule.name} / {d.step}: {target}") + "\n")
        if d.silent:
            out.write(escape_controls(f"  {verb} record only: {d.reason}") + "\n")
            continue
        to = ", ".join(f"{a} ({r})" if r else a for a, r in d.recipients) or "nobody (no address)"
        hooks = f"; webhooks {', '.join(d.webhooks)}" if d.webhooks else ""
        out.write(escape_controls(f"  {verb} {what}: {to}{hooks}") + "\n")
        if i in report.rendered:
            out.write(escape_controls(f"  subject: {report.rendered[i].title}") + "\n")
        out.write(escape_controls(f"  why: {d.reason}") + "\n")
        for note in d.notes:
            out.write(escape_controls(f"  note: {note}") + "\n")
        for g in d.evidence.get("gpus", []) if isinstance(d.evidence.get("gpus"), list) else []:
            if "idle_stretch_seconds" not in g:
                continue
            mark = "*" if g.get("matched") else " "
            util = g.get("idle_stretch_util_max_share")
            out.write(
                escape_controls(
                    f"  {mark} {g.get('gpu')}: idle {_minutes(g.get('idle_stretch_seconds'))}, no process "
                    f"{_minutes(g.get('no_process_stretch_seconds'))}, utilisation max "
                    f"{'-' if util is None else f'{100 * util:.1f} %'}, "
                    f"memory max {_gib(g.get('idle_stretch_memory_used_max_bytes'))}, measured to {g.get('measured_to')} "
                    f"({g.get('source')})"
                )
                + "\n"
            )
        if d.kind == "cancel":
            out.write("  (the job's state and its GPUs' windows are checked again just before scancel)\n")
    if report.skipped:
        out.write("\nNot acted on:\n")
        for s in report.skipped:
            out.write(escape_controls(f"  {s.rule}: {s.job_id or s.subject}: {s.reason}") + "\n")
    if report.due:
        out.write(f"\n{'Would try' if report.dry_run else 'Due'} now: {len(report.due)} earlier deliveries\n")
        for d in report.due[:50]:
            out.write(
                escape_controls(f"  {d.rule} / {d.step}: {d.channel} {d.target} (try {d.tries + 1})") + "\n"
            )
    if report.deliveries:
        out.write("\nDeliveries:\n")
        for o in report.deliveries:
            out.write(
                escape_controls(f"  {o.rule} / {o.step}: {o.channel} {o.target}: {o.state} ({o.detail})")
                + "\n"
            )


def _gib(value: Any) -> str:
    return "-" if value is None else f"{float(value) / 2**30:.1f} GiB"


# ------------------------------------------------------------------ act log


def cmd_log(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.actions import action_log

    if config.api.url:
        from slurmtel.api.client import ApiClient

        rows = ApiClient(config).actions(
            start=args.start, end=args.end, user=args.user, job=args.job, rule=args.rule, limit=args.limit
        )
    else:
        scope = scope_for(config, Action.VIEW_ACTIONS)
        ctx = open_context(config)
        now = ctx.clock()
        start, end = _log_window(args, config, now)
        with ctx.engine.connect() as conn:
            rows = action_log(
                conn,
                scope=scope,
                since=start,
                until=end,
                user=args.user,
                job_id=args.job,
                rule=args.rule,
                limit=args.limit,
            )
    write_log(rows, args.format)
    return EXIT_OK


def _log_window(args: argparse.Namespace, config: Config, now: datetime) -> tuple[datetime, datetime | None]:
    """-S (default 30 days ago) and -E (default: no end, what was decided a moment ago too)."""
    if args.start is None:
        args.start = "now-30days"
    start, end = resolve_window(args, config, now)
    return start, end if args.end is not None else None


def log_rows(rows: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    shown = []
    for r in rows:
        deliveries = r["deliveries"]
        sent_to = "; ".join(f"{d['channel']} {d['target']} {d['state']}" for d in deliveries)
        row = {**r, "sent_to": sent_to}
        if fmt != "json":
            row["evidence"] = json.dumps(r["evidence"], sort_keys=True)
            row["deliveries"] = json.dumps(deliveries, default=str)
        shown.append(row)
    return shown


def write_log(rows: list[dict[str, Any]], fmt: str) -> None:
    shown = log_rows(rows, fmt)
    if fmt == "json":
        json.dump(shown, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    columns = (
        list(LOG_COLUMNS)
        if fmt == "table"
        else [*LOG_COLUMNS, "decided_by", "subject", "title", "deliveries", "evidence"]
    )
    title = f"{len(rows)} recorded action{'s' if len(rows) != 1 else ''}, newest first"
    render(shown, sys.stdout, fmt, columns=columns, title=title)


# ------------------------------------------------------------------ exclusions


_DURATION = re.compile(r"(\d+)\s*(m|min|minutes?|h|hours?|d|days?|w|weeks?)", re.I)


def parse_duration(text: str) -> timedelta:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ConfigError(f"--for: '{text}' is not a duration (30m, 12h, 7d, 2w)")
    n, unit = int(match.group(1)), match.group(2)[0].lower()
    delta = {
        "m": timedelta(minutes=n),
        "h": timedelta(hours=n),
        "d": timedelta(days=n),
        "w": timedelta(weeks=n),
    }[unit]
    if delta <= timedelta(0):
        raise ConfigError("--for must be longer than nothing")
    return delta


def _admin(config: Config) -> str:
    identity = common.current_identity(config)
    scope_for(config, Action.MANAGE_ACTIONS, identity)
    return identity.user


def cmd_exclude(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.actions import add_exclusion, exclusions
    from slurmtel.timeparse import parse_slurm_time

    if args.list:
        if args.user or args.duration or args.until or args.reason:
            raise ConfigError("act exclude --list takes nothing else")
        scope_for(config, Action.MANAGE_ACTIONS)
        ctx = open_context(config)
        now = ctx.clock()
        with ctx.engine.connect() as conn:
            found = exclusions(conn)
        rows = [
            {
                "user": e.user,
                "in_force": e.revoked_at is None and e.starts_at <= now < e.ends_at,
                "starts_at": e.starts_at,
                "ends_at": e.ends_at,
                "reason": e.reason,
                "created_by": e.created_by,
                "created_at": e.created_at,
                "revoked_at": e.revoked_at,
                "revoked_by": e.revoked_by,
            }
            for e in found
        ]
        render(rows, sys.stdout, "table", columns=list(rows[0]) if rows else ["user"], title="Exclusions")
        return EXIT_OK
    if not args.user:
        raise ConfigError("act exclude needs USER (or --list)")
    if not (args.duration or args.until):
        raise ConfigError("act exclude needs --for DURATION or --until TIME: an exclusion has an end")
    if not args.reason or not args.reason.strip():
        raise ConfigError("act exclude needs --reason TEXT (it is recorded)")
    admin = _admin(config)
    ctx = open_context(config)
    now = ctx.clock()
    if args.duration:
        ends = now + parse_duration(args.duration)
    else:
        try:
            ends = parse_slurm_time(args.until, now=now, zone=config.zone)
        except ValueError as exc:
            raise ConfigError(f"--until: {exc}") from exc
        if ends <= now:
            raise ConfigError("--until must be in the future")
    with ctx.engine.begin() as conn:
        number = add_exclusion(
            conn,
            user=args.user,
            starts_at=now,
            ends_at=ends,
            reason=args.reason.strip(),
            created_by=admin,
            now=now,
        )
    print(
        escape_controls(
            f"{args.user} is excluded from every action rule until {ends.astimezone(config.zone):%Y-%m-%d %H:%M %Z} "
            f"(exclusion {number}, by {admin}: {args.reason.strip()})"
        )
    )
    return EXIT_OK


def cmd_include(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.actions import revoke_exclusions

    admin = _admin(config)
    ctx = open_context(config)
    now = ctx.clock()
    with ctx.engine.begin() as conn:
        ended = revoke_exclusions(conn, user=args.user, revoked_by=admin, now=now)
    if not ended:
        print(escape_controls(f"slurmtel: {args.user} is on no exclusion list"), file=sys.stderr)
        return EXIT_ERROR
    print(escape_controls(f"{args.user} is no longer excluded ({ended} exclusion(s) ended by {admin})"))
    return EXIT_OK


# ------------------------------------------------------------------ mailprog


def cmd_mailprog(args: argparse.Namespace, config: Config) -> int:
    """Record a job-end mail, or hand the mail to the fallback; never lose one."""
    from slurmtel.actions.mailprog import END_TYPES, parse_mail
    from slurmtel.actions.settings import KIND_JOB_END

    request = parse_mail(args.subject, os.environ, config.site.cluster)
    wanted = config.actions.enabled and any(
        r.kind == KIND_JOB_END and r.enabled and r.only_when_asked for r in config.actions.rules
    )
    recipients = [r for r in args.recipients if r.strip()]
    if (
        wanted
        and request is not None
        and request.mail_type in END_TYPES
        and not request.array_summary
        and recipients
    ):
        if not request.cluster:
            print("slurmtel: mailprog: no cluster name (SLURM_CLUSTER_NAME or site.cluster)", file=sys.stderr)
        else:
            try:
                _record(config, request, recipients, args.subject)
                return EXIT_OK
            except Exception as exc:  # the mail must not be lost: it goes to the fallback
                print(
                    f"slurmtel: mailprog: cannot record the request ({exc}): passing the mail on",
                    file=sys.stderr,
                )
    return _fallback(config, args)


def _record(config: Config, request: Any, recipients: list[str], subject: str) -> None:
    from slurmtel.store.actions import add_mail_request

    ctx = open_context(config)
    with ctx.engine.begin() as conn:
        add_mail_request(
            conn,
            cluster=request.cluster,
            job_id=request.job_id,
            job_id_raw=request.job_id_raw,
            recipient=",".join(recipients),
            mail_type=request.mail_type,
            mail_subject=subject[:1000],
            now=ctx.clock(),
        )
    ctx.engine.dispose()


def _fallback(config: Config, args: argparse.Namespace) -> int:
    import subprocess

    command = config.actions.mailprog.fallback_command
    if not command:
        print("slurmtel: mailprog: actions.mailprog.fallback_command is empty: mail dropped", file=sys.stderr)
        return EXIT_ERROR
    argv = [command, *(["-s", args.subject] if args.subject else []), *args.recipients]
    try:
        body = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    except (OSError, ValueError):
        body = b""  # no input to pass on (closed, or not readable)
    try:
        done = subprocess.run(argv, input=body, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"slurmtel: mailprog: {command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return done.returncode
