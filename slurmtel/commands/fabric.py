"""`slurmtel report fabric [--nodes]` and `slurmtel report nodes --drift`.

Cluster-wide operational views: VIEW_OPERATIONS (admins), like `report nodes`; -A/-u are
refused, -M applies (and -r to drift). The rows come from slurmtel.store.reports_fabric as frozen
dataclasses; each section renders as a table, CSV block or JSON list of objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from slurmtel.access import Action
from slurmtel.commands import common
from slurmtel.commands.common import (
    EXIT_OK,
    add_filter_arguments,
    add_format_argument,
    add_window_arguments,
    head_only,
    job_filter,
    open_context,
    resolve_window,
    scope_for,
    site_now,
    split_list,
    warn_unknown,
)
from slurmtel.commands.sections import render_sections
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import gpu_name

RUNS_COLUMNS = (
    "run_at",
    "cluster",
    "job_id",
    "label",
    "collective",
    "ranks",
    "node_count",
    "nodes",
    "hosts",
    "gpu_model",
    "nccl_version",
    "tests_version",
    "driver_versions",
    "cuda_versions",
    "data_type",
    "max_size_bytes",
    "avg_busbw_gbytes_per_second",
    "peak_busbw_gbytes_per_second",
    "baseline_busbw_gbytes_per_second",
    "baseline_runs",
    "busbw_ratio",
    "below_baseline",
    "wrong_values",
    "status",
    "reasons",
)
RUNS_TABLE_COLUMNS = (
    "run_at",
    "job_id",
    "collective",
    "ranks",
    "nodes",
    "nccl_version",
    "avg_busbw_gbytes_per_second",
    "baseline_busbw_gbytes_per_second",
    "busbw_ratio",
    "below_baseline",
    "wrong_values",
    "status",
)
SUSPECT_COLUMNS = (
    "cluster",
    "node",
    "runs",
    "bad_runs",
    "bad_share",
    "failed_runs",
    "degraded_runs",
    "below_baseline_runs",
    "named_in_failures",
    "last_bad_at",
)
PORT_COLUMNS = (
    "node",
    "device",
    "port",
    "link_layer",
    "link_rate_gbits_per_second",
    "state",
    "phys_state",
    "windows",
    "measured_seconds",
    "errors",
    "errors_per_hour",
    "symbol_errors",
    "receive_errors",
    "link_downed",
    "link_error_recoveries",
    "xmit_discards",
    "retransmissions",
    "retransmissions_per_hour",
    "xmit_wait_ticks",
    "xmit_wait_ticks_per_second",
    "congestion_notifications",
    "out_of_buffer",
    "xmit_bytes",
    "rcv_bytes",
    "xmit_bytes_per_second",
    "rcv_bytes_per_second",
    "counter_resets",
    "saturated_counters",
    "failed_attempts",
    "node_fail_attempts",
    "failed_nccl_runs",
)
PORT_TABLE_COLUMNS = (
    "node",
    "device",
    "port",
    "link_layer",
    "state",
    "errors",
    "errors_per_hour",
    "link_downed",
    "retransmissions_per_hour",
    "xmit_wait_ticks_per_second",
    "saturated_counters",
    "failed_attempts",
    "failed_nccl_runs",
)
NVLINK_COLUMNS = (
    "node",
    "gpu_uuid",
    "links_active_min",
    "links_active_max",
    "links_total",
    "windows",
    "measured_seconds",
    "replay_errors",
    "recovery_errors",
    "crc_errors",
    "ecc_errors",
    "errors_per_hour",
    "tx_bytes",
    "rx_bytes",
    "tx_bytes_per_second",
    "error_links",
    "failed_attempts",
    "node_fail_attempts",
)
NVLINK_TABLE_COLUMNS = (
    "node",
    # node/index; the UUID with --wide (render.py)
    "gpu",
    "gpu_uuid",
    "links_active_min",
    "links_total",
    "replay_errors",
    "recovery_errors",
    "crc_errors",
    "errors_per_hour",
    "error_links",
    "failed_attempts",
)
DRIFT_COLUMNS = (
    "cluster",
    "partition",
    "node",
    "attribute",
    "value",
    "majority_value",
    "majority_nodes",
    "partition_nodes",
    "since_at",
)


def register(commands: argparse._SubParsersAction, reports: argparse._SubParsersAction) -> None:
    fabric = reports.add_parser(
        "fabric", help="NCCL acceptance runs against their baseline, suspect nodes; --nodes: port counters"
    )
    add_window_arguments(fabric)
    add_filter_arguments(fabric)
    add_format_argument(fabric)
    fabric.add_argument(
        "--nodes",
        nargs="?",
        const="",
        default=None,
        metavar="NODES",
        help="error and congestion rates per node and port (InfiniBand/RoCE, NVLink) beside the "
        "failed attempts on the node; optionally only these comma-separated nodes",
    )
    fabric.set_defaults(handler=cmd_report_fabric)


def rows_of(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(item) for item in items]


def nvlink_rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The NVLink rows with the GPU named as a table shows it (`gpu`: node/index)."""
    return [{**r, "gpu": gpu_name(r["node"], r["gpu_index"], r["gpu_uuid"])} for r in rows_of(items)]


def _cluster_wide(args: argparse.Namespace, report: str) -> None:
    if args.accounts or args.users:
        raise ConfigError(f"report {report} is per node: -A/-u do not apply")


def cmd_report_fabric(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_fabric import fabric_nodes_report, fabric_report

    _cluster_wide(args, "fabric")
    # every value is checked before a database is opened (or an embedded one started)
    now = site_now(config)
    start, end = resolve_window(args, config, now)
    scope = scope_for(
        config, Action.VIEW_OPERATIONS, common.current_identity(config)
    )  # looked up at call time
    ctx = open_context(config)
    window = f"{start.isoformat()} .. {end.isoformat()}"
    table = args.format == "table"
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        if args.nodes is not None:
            nodes = fabric_nodes_report(
                conn,
                start=start,
                end=end,
                now=now,
                scope=scope,
                job_filter=job_filter(args),
                nodes=split_list(args.nodes),
            )
            render_sections(
                {"ports": rows_of(nodes.ports), "nvlinks": nvlink_rows(nodes.nvlinks)},
                sys.stdout,
                args.format,
                {
                    "ports": PORT_TABLE_COLUMNS if table else PORT_COLUMNS,
                    "nvlinks": NVLINK_TABLE_COLUMNS if table else NVLINK_COLUMNS,
                },
                {
                    "ports": f"InfiniBand/RoCE ports, {window}",
                    "nvlinks": "NVLinks per GPU",
                },
            )
            return EXIT_OK
        report = fabric_report(
            conn,
            start=start,
            end=end,
            scope=scope,
            baseline_fraction=config.fabric.baseline_fraction,
            baseline_runs=config.fabric.baseline_runs,
            job_filter=job_filter(args),
        )
    fraction = config.fabric.baseline_fraction
    render_sections(
        {"runs": rows_of(report.runs), "suspects": rows_of(report.suspects)},
        sys.stdout,
        args.format,
        {"runs": RUNS_TABLE_COLUMNS if table else RUNS_COLUMNS, "suspects": SUSPECT_COLUMNS},
        {
            "runs": f"NCCL acceptance runs, {window} (flagged below {fraction:g} x baseline)",
            "suspects": "Nodes most often in bad runs (failed, degraded or below baseline)",
        },
    )
    return EXIT_OK


def cmd_report_drift(args: argparse.Namespace, config: Config) -> int:
    from slurmtel.store.reports_fabric import drift_report

    head_only(config, "report nodes --drift")
    _cluster_wide(args, "nodes --drift")
    scope = scope_for(
        config, Action.VIEW_OPERATIONS, common.current_identity(config)
    )  # looked up at call time
    ctx = open_context(config)
    with ctx.engine.connect() as conn:
        warn_unknown(conn, scope, job_filter(args))
        rows = drift_report(conn, scope=scope, job_filter=job_filter(args))
    render_sections(
        {"drift": rows_of(rows)},
        sys.stdout,
        args.format,
        {"drift": DRIFT_COLUMNS},
        {"drift": "Nodes that differ from the majority of their partition"},
    )
    return EXIT_OK
