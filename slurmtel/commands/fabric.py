"""`slurmtel report fabric [--nodes]` and `slurmtel report nodes --drift`.

Cluster-wide operational views: VIEW_OPERATIONS (admins), like `report nodes`; -A/-u are
refused, -M applies (and -r to drift). The rows come from slurmtel.store.reports_fabric as frozen
dataclasses; each section renders as a table, CSV block or JSON list of objects.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from slurmtel.access import Action
from slurmtel.commands.common import (
    add_filter_arguments,
    add_format_argument,
    add_window_arguments,
    job_filter,
    split_list,
    unknown_filter_warnings,
)
from slurmtel.commands.views import Connect, Document, View, ViewRequest, document, run_cli, scope_of, section
from slurmtel.config import Config
from slurmtel.errors import ConfigError
from slurmtel.reports.render import gpu_name, window_text
from slurmtel.reports.spec import Parameter
from slurmtel.timeparse import report_window

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
    # through slurmtel serve on a login node (api.url), as every report
    fabric.set_defaults(handler=cmd_report_fabric, through_api=True)


def rows_of(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(item) for item in items]


def nvlink_rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The NVLink rows with the GPU named as a table shows it (`gpu`: node/index)."""
    return [{**r, "gpu": gpu_name(r["node"], r["gpu_index"], r["gpu_uuid"])} for r in rows_of(items)]


def cmd_report_fabric(args: argparse.Namespace, config: Config) -> int:
    request = {
        "start": args.start,
        "end": args.end,
        "job_filter": job_filter(args),
        "options": {"nodes": args.nodes} if args.nodes is not None else {},
    }
    return run_cli(NODES_VIEW if args.nodes is not None else VIEW, config, request, args.format)


def cmd_report_drift(args: argparse.Namespace, config: Config) -> int:
    return run_cli(DRIFT_VIEW, config, {"job_filter": job_filter(args)}, args.format)


def _window(config: Config, request: ViewRequest) -> tuple[datetime, datetime]:
    try:
        return report_window(request.start, request.end, now=request.now, zone=config.zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def fabric_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    """`report fabric`: the acceptance runs against their baseline, the suspect nodes."""
    from slurmtel.store.reports_fabric import fabric_report

    # every value is checked before a database is opened (or an embedded one started)
    start, end = _window(config, request)
    scope = scope_of(request.identity, Action.VIEW_OPERATIONS)
    with connect(scope) as conn:
        warnings = unknown_filter_warnings(conn, scope, request.job_filter)
        report = fabric_report(
            conn,
            start=start,
            end=end,
            scope=scope,
            baseline_fraction=config.fabric.baseline_fraction,
            baseline_runs=config.fabric.baseline_runs,
            job_filter=request.job_filter,
        )
    fraction = config.fabric.baseline_fraction
    window = window_text(start, end, config.zone)
    sections = [
        section(
            "runs",
            f"NCCL acceptance runs, {window} (flagged below {fraction:g} x baseline)",
            rows_of(report.runs),
            RUNS_COLUMNS,
            RUNS_TABLE_COLUMNS,
            ("run_at", "collective", "nodes", "avg_busbw_gbytes_per_second", "busbw_ratio", "status"),
        ),
        section(
            "suspects",
            "Nodes most often in bad runs (failed, degraded or below baseline)",
            rows_of(report.suspects),
            SUSPECT_COLUMNS,
            key_columns=("node", "bad_runs", "bad_share", "runs"),
        ),
    ]
    return document("fabric", sections, now=request.now, start=start, end=end, warnings=warnings)


def fabric_nodes_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    """`report fabric --nodes`: error and congestion rates per port and NVLink."""
    from slurmtel.store.reports_fabric import fabric_nodes_report

    start, end = _window(config, request)
    scope = scope_of(request.identity, Action.VIEW_OPERATIONS)
    with connect(scope) as conn:
        warnings = unknown_filter_warnings(conn, scope, request.job_filter)
        nodes = fabric_nodes_report(
            conn,
            start=start,
            end=end,
            now=request.now,
            scope=scope,
            job_filter=request.job_filter,
            nodes=split_list(request.option("nodes")),
        )
    sections = [
        section(
            "ports",
            f"InfiniBand/RoCE ports, {window_text(start, end, config.zone)}",
            rows_of(nodes.ports),
            PORT_COLUMNS,
            PORT_TABLE_COLUMNS,
            ("node", "device", "port", "errors_per_hour", "link_downed", "failed_attempts"),
        ),
        section(
            "nvlinks",
            "NVLinks per GPU",
            nvlink_rows(nodes.nvlinks),
            NODES_VIEW.sections[1][1],
            NVLINK_TABLE_COLUMNS,
            ("gpu", "errors_per_hour", "links_active_min", "error_links", "failed_attempts"),
        ),
    ]
    return document("fabric_nodes", sections, now=request.now, start=start, end=end, warnings=warnings)


def drift_document(config: Config, request: ViewRequest, connect: Connect) -> Document:
    """`report nodes --drift`: the nodes that differ from the majority of their partition."""
    from slurmtel.store.reports_fabric import drift_report

    scope = scope_of(request.identity, Action.VIEW_OPERATIONS)
    with connect(scope) as conn:
        warnings = unknown_filter_warnings(conn, scope, request.job_filter)
        rows = drift_report(conn, scope=scope, job_filter=request.job_filter)
    drift = section(
        "drift",
        "Nodes that differ from the majority of their partition",
        rows_of(rows),
        DRIFT_COLUMNS,
        key_columns=("node", "attribute", "value", "majority_value"),
    )
    return document("nodes_drift", [drift], now=request.now, warnings=warnings)


VIEW = View(
    name="fabric",
    help="NCCL acceptance runs against their baseline, suspect nodes",
    action=Action.VIEW_OPERATIONS,
    build=fabric_document,
    sections=(("runs", RUNS_COLUMNS), ("suspects", SUSPECT_COLUMNS)),
)
NODES_VIEW = View(
    name="fabric_nodes",
    help="error and congestion rates per node and port (InfiniBand/RoCE, NVLink) beside the failed attempts",
    action=Action.VIEW_OPERATIONS,
    build=fabric_nodes_document,
    sections=(("ports", PORT_COLUMNS), ("nvlinks", ("gpu", *NVLINK_COLUMNS))),
    parameters=(Parameter("nodes", str, "", "only these comma-separated nodes"),),
)
DRIFT_VIEW = View(
    name="nodes_drift",
    help="the nodes that differ from the majority of their partition, with since when",
    action=Action.VIEW_OPERATIONS,
    build=drift_document,
    sections=(("drift", DRIFT_COLUMNS),),
    window=False,
)
