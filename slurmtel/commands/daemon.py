"""`slurmtel run` (the head daemon) and `slurmtel check-config [FILE]`.

`run` refuses to start when PostgreSQL cannot be reached or its schema is missing or older
than this slurmtel (it never migrates by itself: run `slurmtel db upgrade`), so under
systemd a broken setup shows up as a failed start with the reason in the journal. Once up it
stays up: a job that fails backs off and retries (slurmtel.scheduler). It speaks systemd's
notify protocol (READY=1 once serving, WATCHDOG=1 while healthy, STOPPING=1), and stops on
SIGTERM or SIGINT: no new runs, running ones get daemon.stop_timeout_seconds to finish, then
it exits with status 0 (a run cut short rolls back its transaction, as after kill -9).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import typing
from types import FrameType
from typing import Any

from slurmtel import __version__
from slurmtel.commands.common import EXIT_OK, EXIT_USAGE, head_only
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.logs import add_secret, log_event
from slurmtel.sdnotify import notify, watchdog_seconds

log = logging.getLogger("slurmtel.daemon")

# between watchdog checks when systemd asked for none (stop requests are noticed at once anyway)
_IDLE_TICK_SECONDS = 5.0


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    run = commands.add_parser(
        "run",
        help="run the head daemon: every enabled source on its interval, attribution, maintenance",
        description=(
            "Run the head daemon in the foreground until SIGTERM. It needs the schema "
            "(`slurmtel db upgrade`) and serves its metrics at http://daemon.listen_address:daemon.port/metrics."
        ),
    )
    run.set_defaults(handler=cmd_run)
    check = commands.add_parser(
        "check-config",
        help="validate a config file and print the effective configuration (secrets masked)",
        description=(
            "Validate FILE (default: --config, $SLURMTEL_CONFIG, else /etc/slurmtel/slurmtel.toml, else the "
            "config `slurmtel demo` left in your state directory) and "
            "print the effective configuration as TOML, with the database password masked. "
            "Exit status 2 with the offending key when it is invalid."
        ),
    )
    # dest=config: the CLI loads (and so validates) FILE before the handler runs
    check.add_argument("config", nargs="?", default=argparse.SUPPRESS, metavar="FILE")
    check.add_argument(
        "--database",
        action="store_true",
        help="also connect to the database and check that its schema is current",
    )
    # on a login node too: it prints the config (--database refuses there)
    check.set_defaults(handler=cmd_check_config, through_api=True)


# ---------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.auth.hook import HookPolicy
    from slurmtel.clock import site_clock
    from slurmtel.metrics import DaemonHttpServer, DaemonMetrics, DatabaseReadings
    from slurmtel.scheduler import Schedule, enabled_sources
    from slurmtel.sources.base import RunContext, utc_now
    from slurmtel.store.daemon import last_success_by_source
    from slurmtel.store.engine import display_url, make_engine, require_schema

    _register_secrets(config)
    engine = make_engine(config)
    # DatabaseUnavailable / SchemaMissing: the CLI says which database, why, and what is wrong; exit 1
    require_schema(engine, config.database_description())
    # site.clock (demos, tests) or the wall clock; a demo's clock file moves on as the daemon runs
    ctx = RunContext(config=config, engine=engine, clock=site_clock(config, utc_now, moving=True))
    metrics = DaemonMetrics([s.name for s in enabled_sources(ctx)])
    metrics.database = DatabaseReadings(engine)
    with engine.connect() as conn:
        metrics.seed_last_success(last_success_by_source(conn))
    schedule = Schedule(ctx, metrics)
    policy = HookPolicy.from_config(config)  # ConfigError: an unreadable job_end_token_file
    try:
        server = DaemonHttpServer(
            config.daemon.listen_address,
            config.daemon.port,
            metrics,
            schedule.job_ended,
            policy=policy,
            rate_per_second=config.daemon.job_end_rate_per_second,
        )
    except OSError as exc:
        raise ConfigError(
            f"daemon.listen_address/port: cannot listen on {config.daemon.listen_address}:"
            f"{config.daemon.port}: {exc.strerror or exc}"
        ) from exc

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        log_event(log, "signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server.start()
    schedule.start()
    host, port = server.address
    log_event(
        log,
        "started",
        version=__version__,
        pid=os.getpid(),
        database=display_url(engine.url),
        jobs=",".join(schedule.states),
        metrics=f"http://{host}:{port}/metrics",
    )
    watchdog = watchdog_seconds()
    notify("READY=1", f"STATUS=running {len(schedule.states)} jobs; metrics on port {port}")
    tick = watchdog / 2 if watchdog else _IDLE_TICK_SECONDS
    withheld: str | None = None
    while True:
        if watchdog:
            reason = schedule.unhealthy_reason()
            if reason is None:
                notify("WATCHDOG=1")
            elif reason != withheld:  # systemd restarts us when the pings stop
                log_event(log, "watchdog_withheld", logging.ERROR, reason=reason)
            withheld = reason
        if stop.wait(tick):
            break

    notify("STOPPING=1", "STATUS=stopping")
    t0 = time.monotonic()
    abandoned = schedule.stop(config.daemon.stop_timeout_seconds)
    server.stop()
    seconds = time.monotonic() - t0
    if abandoned:
        # their threads cannot be interrupted; exiting rolls their transactions back
        log_event(
            log, "stopped", logging.WARNING, seconds=seconds, abandoned=",".join(abandoned), status=EXIT_OK
        )
        logging.shutdown()
        atexit._run_exitfuncs()  # e.g. the embedded PostgreSQL's shutdown
        sys.stdout.flush()
        os._exit(EXIT_OK)
    engine.dispose()
    log_event(log, "stopped", seconds=seconds, status=EXIT_OK)
    return EXIT_OK


def _register_secrets(config: Config) -> None:
    """Mask the database password and the agents' token in every log line, whoever prints it."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    with contextlib.suppress(ConfigError):
        url = config.database_url()
        if url:
            with contextlib.suppress(Exception):  # an unparsable URL: make_engine reports it
                parsed = make_url(url)
                add_secret(parsed.password)
                for key, value in parsed.query.items():
                    if "password" in key.lower():
                        for secret in [value] if isinstance(value, str) else value:
                            add_secret(secret)
    secret_files = [
        config.sources.agent.token_file,
        config.daemon.job_end_token_file,
        # [actions]: the SMTP password and the webhooks' tokens
        config.actions.email.password_file,
        *(hook.token_file for hook in config.actions.webhooks),
    ]
    for token_file in secret_files:
        if token_file:
            with contextlib.suppress(OSError):  # unreadable: its user reports it
                add_secret(Path(token_file).read_text().strip())


# ---------------------------------------------------------------- check-config


def cmd_check_config(args: argparse.Namespace, config: Config) -> int:
    source = str(config.path) if config.path else "built-in defaults (no config file)"
    try:
        database = describe_database(config)
    except ConfigError as exc:
        print(f"slurmtel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.database and config.api_client_only():
        head_only(config, "check-config --database")
    print(f"# slurmtel {__version__}: {source} is valid; the effective configuration follows")
    print(f"# database: {database}")
    print(f"# time zone: {config.timezone_name} ({config.timezone_origin()})")
    sys.stdout.write(dump_toml(config))
    if args.database:
        from slurmtel.store.engine import display_url, make_engine, require_schema

        engine = make_engine(config)
        require_schema(engine, config.database_description())  # raises with the reason; the CLI exits 1
        print(f"# database reachable, schema current ({display_url(engine.url)})")
        engine.dispose()
    return EXIT_OK


def describe_database(config: Config) -> str:
    """Which database the commands use and why (the password masked); on a login-node client,
    that there is none and where the commands go instead."""
    if config.api_client_only():
        return (
            f"none: a login-node client (api.url, no database.url): report, job, me and chargeback "
            f"ask {config.api.url}; the other commands run on the head node"
        )
    return config.database_description()


def mask_url(url: str) -> str:
    """URL with its password replaced by ***, in the user part or the query."""
    from slurmtel.store.engine import display_url

    return display_url(url)


def dump_toml(config: Config) -> str:
    """The effective configuration as TOML that `load_config` reads back (password masked)."""
    lines: list[str] = []
    _dump_table(config, "", lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _dump_table(obj: Any, prefix: str, lines: list[str]) -> None:
    hints = typing.get_type_hints(type(obj))
    scalars, tables, arrays = [], [], []
    for f in dataclasses.fields(obj):
        if not f.metadata.get("toml", True):
            continue
        value = getattr(obj, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            tables.append((f.name, value))
        elif typing.get_origin(hint) is list and value and dataclasses.is_dataclass(value[0]):
            arrays.append((f.name, value))
        else:
            if f"{prefix}{f.name}" == "database.url" and value:
                value = mask_url(value)
            scalars.append(f"{f.name} = {_toml_value(value)}")
    if prefix and (scalars or not tables):
        lines.append(f"\n[{prefix.rstrip('.')}]")
    lines.extend(scalars)
    for name, value in tables:
        _dump_table(value, f"{prefix}{name}.", lines)
    for name, items in arrays:
        for item in items:
            lines.append(f"\n[[{prefix}{name}]]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in dataclasses.asdict(item).items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
