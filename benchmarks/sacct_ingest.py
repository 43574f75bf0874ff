"""sacct ingest throughput: parse + store of `sacct --json` output, against raw binary COPY.

Generates N attempts in the sacct --json shape of Slurm 24.11 (slurmtel.simulate), split into
documents of --batch jobs (one document = one sacct call of the daemon), then measures in one
run:
  ingest: the sacct source's own path (store_documents, what `collect sacct` runs on the
          documents of its sacct calls): parse_sacct_json, then COPY to a staging table,
          upsert on the natural key and job linking, one transaction per document, the next
          document parsed while the previous one is written; into an empty job_attempt table;
  parse:  parse_sacct_json alone over the same documents;
  again:  the same documents ingested a second time over the stored rows (the daemon's
          rescan of a trailing window: every row meets its stored self and the upsert's
          newest-state rule decides it changes nothing);
  copy:   binary COPY of the very same final rows straight into an empty job_attempt table.
Prints jobs/s for each, the ratios to COPY, and the target (>= 20,000 jobs/s end to end).

The daemon reads the job steps too (sacct without -X: CPU time and peak memory per attempt).
The same jobs are measured twice: as `sacct -X` prints them (empty step lists) and with
--usage-steps steps per started job (default 3: batch, extern-like, one srun step) carrying
usage in the shape and size of a real Slurm 22.05 capture's steps; the ratio of the two is
what reading the steps costs slurmtel (slurmdbd's side, fetching the steps, is not here).

    python benchmarks/sacct_ingest.py [--jobs 200000] [--batch 20000] [--usage-steps 3] [--dsn URL]

Without --dsn it uses $SLURMTEL_TEST_DSN / $SLURMTEL_DATABASE_URL, else an embedded PostgreSQL;
it works in a scratch database it creates and drops.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from cputime import Meter, Usage, rate_ratios, run_cpu_line
from scratch import scratch_database
from sqlalchemy import Engine, text

from slurmtel.config import Config
from slurmtel.gcpause import gc_paused
from slurmtel.parsers.sacct_json import parse_sacct_json
from slurmtel.records import JobAttempt
from slurmtel.simulate import render_sacct_json, synthetic_jobs
from slurmtel.sources.base import RunContext, RunResult
from slurmtel.sources.sacct import SacctDocument, store_documents
from slurmtel.store.jobs import attempt_rows, copy_attempt_rows

TARGET_JOBS_PER_SECOND = 20_000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="jobs per sacct --json document")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--usage-steps", type=int, default=3, help="steps per job in the second measurement")
    args = parser.parse_args()

    with scratch_database(args.dsn) as engine:
        print(f"generating {args.jobs:,} jobs in documents of {args.batch:,} ...", flush=True)
        jobs = list(synthetic_jobs(args.jobs, start=datetime(2026, 11, 1, tzinfo=UTC)))
        batches = [jobs[i : i + args.batch] for i in range(0, len(jobs), args.batch)]
        documents = [render_sacct_json(batch) for batch in batches]
        with_steps = [render_sacct_json(batch, usage_steps=args.usage_steps) for batch in batches]
        del jobs, batches
        megabytes = sum(len(d) for d in documents) / 1e6
        steps_megabytes = sum(len(d) for d in with_steps) / 1e6
        print(
            f"  {len(documents)} documents, {megabytes:,.0f} MB of JSON as sacct -X prints them, "
            f"{steps_megabytes:,.0f} MB with {args.usage_steps} steps per job"
        )

        ctx = RunContext(config=Config(), engine=engine)
        meter = Meter(engine)
        whole = meter.start()
        # the sacct source's own path: the documents one `collect sacct` run would fetch, parsed
        # and stored in order, one transaction each (store_documents: parse the next document
        # while the previous one is written)
        steps = _ingest(ctx, engine, meter, with_steps, args.jobs)
        steps_seconds = steps.wall
        del with_steps
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE job_attempt CASCADE"))
        ingest = _ingest(ctx, engine, meter, documents, args.jobs)
        ingest_seconds = ingest.wall

        # the same documents again, over the stored rows: all conflicts, nothing changes
        captured_at = datetime.now(UTC)
        again = RunResult()
        with meter.measure() as again_section:
            store_documents(
                ctx,
                (SacctDocument(f"benchmark document {i}", d, captured_at) for i, d in enumerate(documents)),
                again,
            )
        again_seconds = again_section.usage.wall
        assert again.rows_read == args.jobs and again.rows_written == 0, again

        # parse alone, one document at a time; its attempts are the rows of the COPY baseline
        parse_seconds = 0.0
        rows: list[tuple[object, ...]] = []
        for document in documents:
            p0 = time.perf_counter()
            records = parse_sacct_json(document, origin="benchmark")
            parse_seconds += time.perf_counter() - p0
            rows.extend(attempt_rows(r for r in records if isinstance(r, JobAttempt)))
            del records
        assert len(rows) == args.jobs
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE job_attempt CASCADE"))
        # with the collector paused, as write_attempts runs
        with meter.measure() as copy_section, gc_paused(), engine.begin() as conn:
            for i in range(0, len(rows), args.batch):
                copy_attempt_rows(conn, "job_attempt", rows[i : i + args.batch])
        copy = copy_section.usage
        copy_seconds = copy.wall

        ingest_rate = args.jobs / ingest_seconds
        steps_rate = args.jobs / steps_seconds
        copy_rate = args.jobs / copy_seconds
        print(
            f"ingest (parse + store): {ingest_seconds:7.2f} s  {ingest_rate:10,.0f} jobs/s"
            f"  (parse alone {parse_seconds:.2f} s, {args.jobs / parse_seconds:,.0f} jobs/s)"
        )
        again_rate = args.jobs / again_seconds
        print(f"ingest again (rescan):  {again_seconds:7.2f} s  {again_rate:10,.0f} jobs/s")
        print(
            f"ingest with {args.usage_steps} steps/job: {steps_seconds:7.2f} s  {steps_rate:10,.0f} jobs/s"
            f"  ({steps_megabytes / megabytes:.1f}x the JSON)"
        )
        print(f"binary COPY, same rows: {copy_seconds:7.2f} s  {copy_rate:10,.0f} jobs/s")
        print(f"ratio ingest / COPY:    {ingest_rate / copy_rate:.2f}")
        print(f"ratio ingest again / COPY: {again_rate / copy_rate:.2f}")
        print(f"ratio with steps / without: {steps_rate / ingest_rate:.2f}")
        print(f"ingest:       {ingest}")
        print(f"ingest again: {again_section.usage}")
        print(f"with steps:   {steps}")
        print(f"binary COPY:  {copy}")
        print(rate_ratios("ratio ingest / COPY", ingest, copy))
        print(rate_ratios("ratio ingest again / COPY", again_section.usage, copy))
        print(rate_ratios("ratio with steps / without", steps, ingest))
        print(f"ingest jobs/s from CPU: {args.jobs / ingest.cpu:,.0f} jobs per CPU-second")
        verdict = "met" if ingest_rate >= TARGET_JOBS_PER_SECOND else "NOT met"
        steps_verdict = "met" if steps_rate >= TARGET_JOBS_PER_SECOND else "NOT met"
        print(
            f"target: >= {TARGET_JOBS_PER_SECOND:,} jobs/s end to end: {verdict} (with steps: {steps_verdict})"
        )
        print(run_cpu_line(whole.stop()))
        return 0


def _ingest(ctx: RunContext, engine: Engine, meter: Meter, documents: list[bytes], jobs: int) -> Usage:
    """What the sacct source takes to parse and store DOCUMENTS into an empty job_attempt."""
    result = RunResult()
    # each document carries its capture time, as the daemon's sacct calls do
    captured_at = datetime.now(UTC)
    with meter.measure() as section:
        store_documents(
            ctx,
            (SacctDocument(f"benchmark document {i}", d, captured_at) for i, d in enumerate(documents)),
            result,
        )
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM job_attempt")).scalar_one()
    assert stored == result.rows_read == result.rows_written == jobs, (stored, result)
    return section.usage


if __name__ == "__main__":
    sys.exit(main())
