"""The daemon's metrics of acting (slurmtel_action_*) and the per-node and per-job gauges the
Prometheus alerting rules of config/alerts/ read (slurmtel_node_*, slurmtel_job_*).

The node and job gauges are set at each evaluation from what it read (a snapshot replaced
whole, so a job that ended leaves no stale series). They hold job ids, partitions and node
names, never users or job names: /metrics is open to Prometheus (slurmtel.metrics).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass
class GaugeSnapshot:
    """What one evaluation saw, for the gauges."""

    # node -> GPUs of running jobs whose newest window is idle / has no process on the GPU
    node_idle_gpus: dict[str, int] = field(default_factory=dict)
    node_no_process_gpus: dict[str, int] = field(default_factory=dict)
    # (cluster, job_id, partition) -> idle GPUs, and the longest current idle stretch (seconds)
    job_idle_gpus: dict[tuple[str, str, str], int] = field(default_factory=dict)
    job_idle_seconds: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # (node, kind) -> GPU events (xid, ecc_single_bit, ecc_double_bit) in the last 24 hours
    node_events: dict[tuple[str, str], int] = field(default_factory=dict)


class ActionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decided = Counter(
            "slurmtel_actions_decided",
            "Actions recorded, by rule and kind (message, cancel, alert)",
            ["rule", "kind"],
            registry=r,
        )
        self.deliveries = Counter(
            "slurmtel_action_deliveries",
            "Delivery tries by channel and result: sent, retry (failed, tried again later), failed (given up), "
            "uncertain (the process died waiting for the answer), not_done (a cancel the re-check stopped)",
            ["channel", "result"],
            registry=r,
        )
        self.suppressed = Counter(
            "slurmtel_action_rule_suppressed",
            "Evaluations in which a rule would have acted on more than max_jobs_per_run and acted on none",
            ["rule"],
            registry=r,
        )
        self.rule_errors = Counter(
            "slurmtel_action_rule_errors",
            "Evaluations of a rule that failed (see the log)",
            ["rule"],
            registry=r,
        )
        self.runs = Counter(
            "slurmtel_action_runs",
            "Action evaluations by status (ok, error, lease_held)",
            ["status"],
            registry=r,
        )
        self.duration = Gauge(
            "slurmtel_action_last_run_duration_seconds",
            "Duration of the last evaluation and delivery",
            registry=r,
        )
        self.evaluation_duration = Gauge(
            "slurmtel_action_last_evaluation_duration_seconds",
            "Duration of the last evaluation alone",
            registry=r,
        )
        self.last_success = Gauge(
            "slurmtel_action_last_success_timestamp_seconds", "When the last evaluation succeeded", registry=r
        )
        self.open_deliveries = Gauge(
            "slurmtel_action_deliveries_open",
            "Deliveries by state after the last run: pending (to be tried), failed, uncertain",
            ["state"],
            registry=r,
        )
        self._snapshot = GaugeSnapshot()
        self._lock = threading.Lock()
        r.register(_SnapshotCollector(self))

    def set_snapshot(self, snapshot: GaugeSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def snapshot(self) -> GaugeSnapshot:
        with self._lock:
            return self._snapshot


class _SnapshotCollector(Collector):
    def __init__(self, metrics: ActionMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.metrics.snapshot()
        idle = GaugeMetricFamily(
            "slurmtel_node_gpus_idle",
            "GPUs of running jobs on the node whose newest window is idle",
            labels=["node"],
        )
        for node, n in sorted(s.node_idle_gpus.items()):
            idle.add_metric([node], n)
        yield idle
        no_process = GaugeMetricFamily(
            "slurmtel_node_gpus_no_process",
            "GPUs of running jobs on the node with no process on them in their newest window",
            labels=["node"],
        )
        for node, n in sorted(s.node_no_process_gpus.items()):
            no_process.add_metric([node], n)
        yield no_process
        events = GaugeMetricFamily(
            "slurmtel_node_gpu_events", "GPU events on the node in the last 24 hours", labels=["node", "kind"]
        )
        for (node, kind), n in sorted(s.node_events.items()):
            events.add_metric([node, kind], n)
        yield events
        job_gpus = GaugeMetricFamily(
            "slurmtel_job_gpus_idle",
            "Idle GPUs of a running job (newest window)",
            labels=["cluster", "job_id", "partition"],
        )
        job_seconds = GaugeMetricFamily(
            "slurmtel_job_idle_seconds",
            "The longest current stretch of idle windows among a running job's GPUs",
            labels=["cluster", "job_id", "partition"],
        )
        for key, n in sorted(s.job_idle_gpus.items()):
            job_gpus.add_metric(list(key), n)
        for key, seconds in sorted(s.job_idle_seconds.items()):
            job_seconds.add_metric(list(key), seconds)
        yield job_gpus
        yield job_seconds
