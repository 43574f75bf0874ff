"""The agent's own health as Prometheus metrics, in a private registry (no global state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slurmtel.agent.spool import Spool


class _SpoolCollector(Collector):
    """Reads the spool's counters at scrape time (they live in the spool file)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    def collect(self) -> Iterator[Metric]:
        stats = self.spool.stats()
        yield GaugeMetricFamily("slurmtel_agent_spool_items", "Items waiting in the spool", value=stats.items)
        yield GaugeMetricFamily(
            "slurmtel_agent_spool_bytes", "Payload bytes waiting in the spool", value=stats.bytes
        )
        yield CounterMetricFamily(
            "slurmtel_agent_spool_evicted",
            "Items dropped unacknowledged because the spool was full",
            value=stats.evicted_total,
        )
        yield GaugeMetricFamily(
            "slurmtel_agent_spool_last_seq", "Highest sequence number assigned", value=stats.last_seq
        )
        yield GaugeMetricFamily(
            "slurmtel_agent_spool_acked_cursor",
            "Highest cursor the head acknowledged",
            value=stats.acked_cursor,
        )
        yield GaugeMetricFamily(
            "slurmtel_agent_spool_served_cursor",
            "Highest cursor a /v1/summaries page covered (acks beyond it are clamped to it)",
            value=stats.served_cursor,
        )


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.samples = Counter(
            "slurmtel_agent_samples", "GPU samples taken (one per GPU or MIG instance)", registry=r
        )
        self.dropped_samples = Counter(
            "slurmtel_agent_dropped_samples", "GPU samples not taken or refused", ["reason"], registry=r
        )
        self.nvml_errors = Counter(
            "slurmtel_agent_nvml_errors", "NVML call failures", ["call", "error"], registry=r
        )
        self.spool_errors = Counter(
            "slurmtel_agent_spool_write_errors", "Spool writes that failed", registry=r
        )
        self.summaries = Counter("slurmtel_agent_summaries", "Window summaries spooled", registry=r)
        self.events = Counter("slurmtel_agent_gpu_events", "XID and ECC events spooled", ["kind"], registry=r)
        self.last_sample = Gauge(
            "slurmtel_agent_last_sample_timestamp_seconds", "When the last sampling round ran", registry=r
        )
        self.gpus = Gauge("slurmtel_agent_gpus", "GPUs and MIG instances being sampled", registry=r)
        self.acks_clamped = Counter(
            "slurmtel_agent_acks_clamped",
            "Acks beyond the last cursor served, clamped to it (nothing unserved is dropped)",
            registry=r,
        )
        self.http_requests = Counter(
            "slurmtel_agent_http_requests", "HTTP requests served", ["method", "path", "code"], registry=r
        )
        self.http_refused = Counter(
            "slurmtel_agent_http_refused",
            "Connections the listener answered itself: connections/address (over the limits, 503), "
            "busy (every worker busy, 503), timeout (request not received in time, 408), "
            "head_too_large, body_too_large, bad_length, accept_error, handler_error",
            ["reason"],
            registry=r,
        )

    def watch_spool(self, spool: Spool) -> None:
        self.registry.register(_SpoolCollector(spool))
