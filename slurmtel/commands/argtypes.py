"""Argument values checked before a command does any work: a bad one is a usage error (exit 2,
one line), never a database error half-way through."""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

# MAX_COUNT: the bound of a count a command hands to SQL, the API's too
from slurmtel.bounds import MAX_COUNT
from slurmtel.commands import EXIT_ERROR, EXIT_USAGE
from slurmtel.config import Config
from slurmtel.errors import ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    from slurmtel.sources.base import Source

# job_attempt.job_id_raw is a bigint
MAX_JOB_ID = 2**63 - 1
# what `slurmtel job --plot FILE` writes, named by FILE's extension
PLOT_FORMATS = ("png", "svg", "pdf")
# the time options a `collect` source may have: (dest, the flag as typed)
COLLECT_TIME_OPTIONS = (("start", "-S"), ("end", "-E"), ("input_at", "--at"))


def positive_int(value: str) -> int:
    """argparse type: a whole number 1 .. MAX_COUNT."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a whole number") from None
    if not 1 <= number <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_COUNT}, not {value}")
    return number


def role_name(value: str) -> str:
    """argparse type: a role name as slurmtel makes it (lower case, digits, underscores)."""
    from slurmtel.store.roles import GROUPS, ROLE_NAME

    if not ROLE_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"'{value}' is not a role name: lower-case letters, digits and _, at most 63, not starting with a digit"
        )
    if value in GROUPS:
        raise argparse.ArgumentTypeError(f"'{value}' is a group role; name the login role that joins it")
    return value


def check_job_id(text: str) -> None:
    """A job id as `slurmtel job` takes it (123, 10_4, 123+1), each number in range."""
    from slurmtel.filters import JOB_ID

    if not JOB_ID.fullmatch(text):
        raise ConfigError(f"'{text}' is not a job id (forms: 123, 10_4 for an array task, 123+1)")
    job, _, task = text.replace("+", "_").partition("_")
    if not 1 <= int(job) <= MAX_JOB_ID:
        raise ConfigError(f"job id must be between 1 and 2^63-1, not {job}")
    if task and int(task) > MAX_JOB_ID:
        raise ConfigError(f"array task / component in '{text}' must be at most 2^63-1")


def plot_format(path: Path) -> str:
    """The format --plot PATH names by its extension; checked before any work is done: another
    extension is a usage error (exit 2), a folder that is not there or not writable the
    environment's (exit 1)."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        accepted = ", ".join(f".{f}" for f in PLOT_FORMATS)
        raise ConfigError(f"--plot {path}: the file name must end in {accepted}")
    folder = path.parent
    if not folder.is_dir():
        raise SlurmtelError(f"--plot {path}: no folder {folder}")
    if path.is_dir():
        raise SlurmtelError(f"--plot {path}: is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SlurmtelError(f"--plot {path}: not writable")
    return fmt


def check_output_file(path: Path, flag: str) -> None:
    """A file a command will write, checked before it does any work: its folder must be there
    and writable (SlurmtelError, exit 1: the environment's), and it must not be a folder."""
    folder = path.parent
    if not folder.is_dir():
        raise SlurmtelError(f"{flag} {path}: no folder {folder}")
    if path.is_dir():
        raise SlurmtelError(f"{flag} {path}: is a folder")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SlurmtelError(f"{flag} {path}: not writable")


def check_collect_arguments(source: Source, args: argparse.Namespace, config: Config, now: datetime) -> None:
    """The arguments given to `collect SOURCE`, read before the run and before any database is
    opened: a typo is a usage error (exit 2), a capture that is not there the environment's
    (exit 1), and neither records a failed run nor starts an embedded PostgreSQL. The source
    checks what only it knows (Source.check_options)."""
    times: dict[str, datetime] = {}
    for dest, flag in COLLECT_TIME_OPTIONS:
        value = getattr(args, dest, None)
        if value:
            try:
                times[dest] = parse_slurm_time(value, now=now, zone=config.zone)
            except ValueError as exc:
                raise ConfigError(f"{flag}: {exc}") from exc
    start, end = times.get("start"), times.get("end")
    if start is not None and start >= (end or now):
        raise ConfigError(
            f"empty window: -S {start.isoformat()} is not before "
            + (f"-E {end.isoformat()}" if end else f"now ({now.isoformat()})")
        )
    zone = getattr(args, "input_timezone", None)
    if zone:
        try:
            ZoneInfo(zone)
        except Exception as exc:
            raise ConfigError(f"--timezone: unknown time zone '{zone}'") from exc
    for entry in getattr(args, "extra_targets", None) or ():
        from slurmtel.sources.targets import parse_target

        parse_target(entry, port=0)
    job = getattr(args, "job", None)
    if job:
        try:
            check_job_id(job)
        except ConfigError as exc:
            raise ConfigError(f"--job: {exc}") from exc
    for dest, flag in (("input", "--input"), ("nodes_input", "--nodes-input")):
        path = getattr(args, dest, None)
        if path is not None:
            _check_readable(Path(path), flag)
    check_options = getattr(source, "check_options", None)
    if check_options is not None:
        check_options(args, config)


def _check_readable(path: Path, flag: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise SourceUnavailable(f"{flag}: cannot read {path}: {exc.strerror}") from None


def usage_or_error(error_kind: str) -> int:
    """A failed collect run's exit status: 2 when the source refused an argument or setting
    (config_error), else 1."""
    return EXIT_USAGE if error_kind == ConfigError.kind else EXIT_ERROR
