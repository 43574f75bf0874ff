"""The lustre source: per-job filesystem traffic from Lustre jobstats.

`collect lustre --once` runs `sources.lustre.command` (default `lctl get_param
obdfilter.*.job_stats mdt.*.job_stats`, on a host where lctl sees the targets: an OSS/MDS, or
a node with the parameters mirrored) or reads `sources.lustre.path` (a file a site's own job
writes, e.g. gathered from every server with pdsh); `--input FILE` stores a saved capture.
Each run stores the snapshot of every entry (cumulative counters, idempotent on target, job
name and snapshot time); increases are taken between an entry's snapshots when a job's
traffic is read (slurmtel.store.hostside.lustre_job_totals), so a counter reset or a job id
reused by a later job (a new entry start_time) counts from zero. Entries whose job name holds
no Slurm job id (`sources.lustre.job_pattern`) are stored with job_id "" (the cluster's
non-Slurm traffic). A bad entry is quarantined with its reason; the others are stored.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmtel.config import Config
from slurmtel.errors import SourceUnavailable
from slurmtel.sources.base import RunContext, RunResult

NAME = "lustre"
# a larger capture is refused rather than read (a big file system has ~100 bytes a counter line)
MAX_BYTES = 512 * 1024 * 1024


class LustreSource:
    name = NAME
    description = (
        "Lustre jobstats (obdfilter/mdt job_stats): each Slurm job's bytes and operations on the file system"
    )

    def enabled(self, config: Config) -> bool:
        return config.sources.lustre.enabled

    def interval_seconds(self, config: Config) -> int:
        return config.sources.lustre.interval_seconds

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--target",
            default="",
            metavar="NAME",
            help="with --input: the target a capture without headings (lctl get_param -n) is of",
        )

    def collect(self, ctx: RunContext, options: argparse.Namespace) -> RunResult:
        from slurmtel.sources.io import run_command

        cfg = ctx.config.sources.lustre
        if cfg.path:
            return self._store(ctx, _read(Path(cfg.path)), cfg.path, "")
        raw = run_command(cfg.command, timeout_seconds=cfg.timeout_seconds)
        return self._store(ctx, raw, " ".join(cfg.command), "")

    def ingest(self, ctx: RunContext, path: Path, options: argparse.Namespace) -> RunResult:
        return self._store(ctx, _read(path), str(path), getattr(options, "target", ""))

    def _store(self, ctx: RunContext, raw: bytes, origin: str, target: str) -> RunResult:
        from slurmtel.parsers.lustre import parse_lustre_jobstats
        from slurmtel.records import LustreJobStat, Rejected
        from slurmtel.store.hostside import write_lustre_stats
        from slurmtel.store.quarantine import quarantine

        records = parse_lustre_jobstats(
            raw, origin=origin, target=target, job_pattern=ctx.config.sources.lustre.job_pattern
        )
        stats = [r for r in records if isinstance(r, LustreJobStat)]
        rejected = [r for r in records if isinstance(r, Rejected)]
        result = RunResult(rows_read=len(records))
        with ctx.engine.begin() as conn:
            result.rows_written = write_lustre_stats(conn, stats)
            quarantine(conn, rejected)
        result.rows_quarantined = len(rejected)
        jobs = {s.job_id for s in stats if s.job_id}
        result.notes.append(
            f"{len(stats)} jobstats entries ({result.rows_written} new) of {len(jobs)} Slurm jobs on "
            f"{len({s.target for s in stats})} targets"
            + (f", {len(rejected)} quarantined" if rejected else "")
        )
        return result


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SourceUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_BYTES:
        raise SourceUnavailable(f"{path} is larger than {MAX_BYTES} bytes")
    return data
