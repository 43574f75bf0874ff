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
from slurmtel.commands.common import EXIT_ERROR, EXIT_USAGE
from slurmtel.config import Config
from slurmtel.errors import ConfigError, SlurmtelError
from slurmtel.timeparse import parse_slurm_time

if TYPE_CHECKING:
    pass

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


def check_collect_arguments(args: argparse.Namespace, config: Config, now: datetime) -> None:
    """The times and zone given to `collect SOURCE`, read before the run: a typo is a usage
    error (exit 2) and records no failed run."""
    for dest, flag in COLLECT_TIME_OPTIONS:
        value = getattr(args, dest, None)
        if value:
            try:
                parse_slurm_time(value, now=now, zone=config.zone)
            except ValueError as exc:
                raise ConfigError(f"{flag}: {exc}") from exc
    zone = getattr(args, "input_timezone", None)
    if zone:
        try:
            ZoneInfo(zone)
        except Exception as exc:
            raise ConfigError(f"--timezone: unknown time zone '{zone}'") from exc


def usage_or_error(error_kind: str) -> int:
    """A failed collect run's exit status: 2 when the source refused an argument or setting
    (config_error), else 1."""
    return EXIT_USAGE if error_kind == ConfigError.kind else EXIT_ERROR
