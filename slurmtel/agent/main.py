"""`slurmtel-agent`: sample NVML, summarise, spool, serve, until SIGTERM.

    slurmtel-agent [--config FILE] [--fake-nvml CAPTURE [--fake-state load|idle]]

Exit status: 0 after a clean stop, 1 when NVML or the spool cannot be used, 2 for a
configuration or usage error (including a port that cannot be bound).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from slurmtel import __version__
from slurmtel.agent.fabric import (
    FabricWindows,
    FsReading,
    gpfs_reading,
    nfs_reading,
    read_infiniband,
    read_nvlinks,
)
from slurmtel.agent.host import HostWindows, read_jobs, with_pcie
from slurmtel.agent.metrics import AgentMetrics
from slurmtel.agent.nvml import NvmlApi, NvmlError
from slurmtel.agent.protocol import AgentRecord
from slurmtel.agent.sampler import Sampler
from slurmtel.agent.server import AgentHttpServer
from slurmtel.agent.spool import Spool
from slurmtel.agent.summarize import WindowSummarizer
from slurmtel.agent.token import TOKEN_FILE_NAME, ensure_token, read_token
from slurmtel.agent.topology import GpuLinks, discover_nvlinks, nvml_topology
from slurmtel.config import Config, load_config
from slurmtel.errors import ConfigError, SlurmtelError
from slurmtel.listen import ListenLimits
from slurmtel.logs import configure_logging
from slurmtel.parsers.mmpmon import parse_mmpmon_fs_io_s
from slurmtel.parsers.mountstats import parse_mountstats
from slurmtel.records import (
    GpfsFsIo,
    GpuEvent,
    GpuHostWindow,
    GpuInventory,
    GpuSummary,
    JobCgroupReading,
    NfsMountStats,
    NodeTopology,
    Rejected,
)
from slurmtel.sdnotify import notify, watchdog_seconds

log = logging.getLogger("slurmtel.agent")

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# GPUs and MIG layouts are looked at again this often; inventory is spooled when it changed,
# and at least once a day so the head always has a recent one
REDISCOVER_SECONDS = 300.0
INVENTORY_REFRESH_SECONDS = 86400.0
# longest single wait, so SIGTERM is noticed quickly even inside nvmlEventSetWait
_MAX_WAIT_SECONDS = 0.5
_SUMMARIZER_STATE = "summarizer"
_FABRIC_STATE = "fabric"
_HOST_STATE = "host"


def node_name(config: Config) -> str:
    return config.agent.node_name or socket.gethostname().split(".")[0]


def spool_path(config: Config) -> Path:
    return (
        Path(config.agent.spool_path)
        if config.agent.spool_path
        else config.state_dir() / "agent-spool.sqlite"
    )


def token_path(config: Config) -> Path:
    """agent.token_file, else agent-token beside the spool (<state_dir>/agent-token)."""
    if config.agent.token_file:
        return Path(config.agent.token_file)
    return spool_path(config).parent / TOKEN_FILE_NAME


def agent_token(config: Config) -> str:
    """The token /v1/* need: the configured file's (which must exist), else the agent's own,
    made on first start. ConfigError when it cannot be read or made."""
    path = token_path(config)
    if config.agent.token_file:
        try:
            return read_token(path)
        except FileNotFoundError:
            raise ConfigError(f"agent.token_file: {path} does not exist") from None
    try:
        token, made = ensure_token(path)
    except OSError as exc:
        raise ConfigError(f"cannot make the agent token {path}: {exc}") from exc
    if made:
        log.warning(
            "no agent.token_file: made a token in %s (mode 0600); the head needs it: copy it to "
            "the head as <sources.agent.token_dir>/%s, or set one shared token_file on both",
            path,
            node_name(config),
        )
    else:
        log.info("agent token: %s", path)
    return token


def _inventory_key(records: Sequence[GpuInventory]) -> list[tuple[object, ...]]:
    return sorted(
        (
            r.gpu_uuid,
            r.index,
            r.model,
            r.memory_total_bytes,
            r.minor_number,
            r.pci_bus_id,
            r.driver_version,
            r.cuda_version,
            r.vbios_version,
            r.mig_mode,
            r.parent_gpu_uuid,
            r.mig_profile,
            r.gpu_fraction,
            r.power_limit_watts,
        )
        for r in records
    )


def _topology_key(topology: NodeTopology) -> tuple[object, ...]:
    return (topology.devices, topology.links, topology.gpu_uuids, topology.p2p)


class Agent:
    """Sampling loop + spool + HTTP server. `run()` blocks until `stop` is set."""

    def __init__(
        self,
        config: Config,
        nvml: NvmlApi,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        agent = config.agent
        self.config = config
        self.nvml = nvml
        self.clock = clock
        self.monotonic = monotonic
        self.node = node_name(config)
        self.metrics = AgentMetrics()
        # first: without a token there is nothing to serve, and nothing to open
        token = agent_token(config)
        self.spool = Spool(spool_path(config), agent.spool_max_bytes)
        self.metrics.watch_spool(self.spool)
        self.sampler = Sampler(
            nvml, self.node, agent.proc_root, self.metrics, clock, agent.pcie_sample_every, agent.host_signals
        )
        self.summarizer = WindowSummarizer(
            self.node,
            agent.summary_window_seconds,
            agent.sample_interval_seconds,
            agent.idle_threshold_percent,
        )
        self.server = AgentHttpServer(
            self.spool,
            self.metrics,
            self.node,
            __version__,
            agent.listen_address,
            agent.port,
            token=token,
            limits=ListenLimits(
                max_connections=agent.max_connections,
                max_connections_per_address=agent.max_connections_per_address,
                request_timeout_seconds=agent.request_timeout_seconds,
            ),
        )
        self._inventory: list[tuple[object, ...]] = []
        self._inventory_spooled_at = 0.0
        self._discovered_at = 0.0
        # fabric counters: read once per summary window, at the first tick after its end
        self.fabric = FabricWindows(self.node, float(agent.summary_window_seconds))
        self._fabric_window = -1
        self._nvlink_gpus: list[GpuLinks] = []
        self._topology: tuple[object, ...] = ()
        self._topology_spooled_at = 0.0
        # the jobs' cgroups: read every round, shipped per summary window
        self.host = (
            HostWindows(self.node, float(agent.summary_window_seconds)) if agent.host_signals else None
        )
        # bad cgroup files already shipped to the head's quarantine (once each)
        self._rejected_sent: set[tuple[str, str]] = set()
        self._host_read_at: float | None = None
        # GPU host windows whose PCIe bytes wait for their job windows
        self._pcie: list[GpuHostWindow] = []

    # lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.nvml.init()
        self.rediscover(force=True)
        saved = self.spool.get_state(_SUMMARIZER_STATE)
        if saved:
            self._spool_summaries(self.summarizer.restore_state(saved, self.clock()))
            self.spool.delete_state(_SUMMARIZER_STATE)
        fabric = self.spool.get_state(_FABRIC_STATE)
        if fabric:
            self.fabric.restore_state(fabric)
        host = self.spool.get_state(_HOST_STATE)
        if host and self.host is not None:
            self.host.restore_state(host)
        self.server.start()
        host, port = self.server.address
        log.info(
            "slurmtel-agent %s on %s: %d GPUs/MIG instances, listening on http://%s:%d",
            __version__,
            self.node,
            len(self.sampler.devices),
            host,
            port,
        )

    def close(self) -> None:
        """Stop serving and keep the open windows for the next start."""
        self.server.stop()
        self.sampler.stop_events()
        self.spool.set_state(_SUMMARIZER_STATE, self.summarizer.export_state())
        self.spool.close()
        try:
            self.nvml.shutdown()
        except NvmlError as exc:
            log.warning("NVML shutdown: %s", exc)

    def run(self, stop: threading.Event) -> None:
        interval = self.config.agent.sample_interval_seconds
        next_tick = self.monotonic()
        watchdog = watchdog_seconds()
        pinged = self.monotonic()
        while not stop.is_set():
            self.tick()
            # systemd's watchdog (WatchdogSec=): a sampling loop that stops turning gets restarted
            if watchdog and self.monotonic() - pinged >= watchdog / 2:
                notify("WATCHDOG=1")
                pinged = self.monotonic()
            next_tick += interval
            now = self.monotonic()
            if next_tick < now:  # fell behind (a slow NVML call): skip, do not burst
                next_tick = now
            while not stop.is_set():
                remaining = next_tick - self.monotonic()
                if remaining <= 0:
                    break
                wait = min(remaining, _MAX_WAIT_SECONDS)
                if self.sampler.events_enabled:
                    self._spool_events(self.sampler.wait_events(int(wait * 1000)))
                else:
                    stop.wait(wait)
            if self.monotonic() - self._discovered_at >= REDISCOVER_SECONDS:
                self.rediscover()

    # one round ----------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        closed: list[GpuSummary] = []
        for sample in self.sampler.sample():
            closed.extend(self.summarizer.add(now, sample))
        closed.extend(self.summarizer.flush(now))
        if self.summarizer.out_of_order:
            self.metrics.dropped_samples.labels(reason="out_of_order").inc(self.summarizer.out_of_order)
            self.summarizer.out_of_order = 0
        if self.summarizer.clock_resets:
            log.warning("wall clock went back; %d GPU accounts restarted", self.summarizer.clock_resets)
            self.summarizer.clock_resets = 0
        self._spool_summaries(closed)
        self._spool_events(self.sampler.take_counter_events())
        self.read_fabric(now)
        self.read_host(now)

    def read_host(self, now: float) -> None:
        """Every agent.cgroup_read_seconds and at a window's first round: the jobs' cgroup
        counters; spooled when a window closed (with the baselines, one transaction), with the
        GPUs' throttle and PCIe windows."""
        if self.host is None:
            return
        gpu_windows = self.summarizer.take_host_windows()
        # the head keeps a GPU's host window only when it was throttled; its PCIe bytes go to
        # the job windows of the jobs on it (the window just closed, one read below)
        self._pcie.extend(gpu_windows)
        records: list[AgentRecord] = [g for g in gpu_windows if g.throttled]
        bad: list[Rejected] = []
        due = self._host_read_at is None or now - self._host_read_at >= self.config.agent.cgroup_read_seconds
        # the first round of a window too: its windows close without waiting for the next read
        if due or self.host.window_start != self.host.window_start_of(now):
            self._host_read_at = now
            try:
                readings = read_jobs(self.config.agent.cgroup_root, self.node)
            except OSError as exc:  # an unreadable cgroup tree costs this round, not the agent
                log.warning("job cgroups unreadable: %s", exc)
                readings = []
            good = [r for r in readings if isinstance(r, JobCgroupReading)]
            bad = [
                r
                for r in readings
                if isinstance(r, Rejected) and (r.record_key, r.reason) not in self._rejected_sent
            ]
            closed = self.host.add(now, good)
            if closed:
                closed = with_pcie(closed, self._pcie)
                self._pcie = [g for g in self._pcie if g.window_start_at > closed[0].window_start_at]
            records[:0] = closed
        for rejected in bad:
            self._rejected_sent.add((rejected.record_key, rejected.reason))
            log.warning("%s: %s", rejected.record_key, rejected.reason)
            records.append(rejected)
        if not records:
            return
        try:
            self.spool.append_records(records, state=(_HOST_STATE, self.host.export_state()))
        except sqlite3.Error as exc:
            log.error("spool write failed, %d host windows lost: %s", len(records), exc)
            self.metrics.spool_errors.inc()

    def read_fabric(self, now: float) -> None:
        """At the first tick of each window: the fabric counters' increases since the last
        read, spooled with the readings themselves (the next window's baseline)."""
        window = int(now // self.fabric.window_seconds)
        if window == self._fabric_window:
            return
        self._fabric_window = window
        try:
            ports = self.fabric.port_windows(read_infiniband(self.config.agent.sysfs_root), now)
        except OSError as exc:  # an unreadable sysfs tree costs this window, not the agent
            log.warning("InfiniBand counters unreadable: %s", exc)
            ports = []
        gpus = [(g.uuid, g.handle, g.active, len(g.links)) for g in self._nvlink_gpus if g.active]
        nvlinks = self.fabric.nvlink_windows(read_nvlinks(self.nvml, gpus, self.sampler.record_error), now)
        records: list[AgentRecord] = [*ports, *nvlinks, *self.read_mounts(now)]
        try:
            self.spool.append_records(records, state=(_FABRIC_STATE, self.fabric.export_state()))
        except sqlite3.Error as exc:
            log.error("spool write failed, %d fabric windows lost: %s", len(records), exc)
            self.metrics.spool_errors.inc()

    def read_mounts(self, now: float) -> list[AgentRecord]:
        """The node's network file system clients' increases, once a window with the fabric
        counters: NFS mounts (agent.mountstats_path) and GPFS file systems (agent.mmpmon_command).
        Text that cannot be read is sent to the head's quarantine once."""
        agent = self.config.agent
        readings: list[FsReading] = []
        parsed: list[object] = []
        if agent.mountstats_path:
            try:
                raw = Path(agent.mountstats_path).read_bytes()
            except OSError as exc:
                log.warning("NFS mount counters unreadable: %s", exc)
            else:
                mounts = parse_mountstats(raw, origin=f"{self.node}:{agent.mountstats_path}")
                readings += [nfs_reading(m) for m in mounts if isinstance(m, NfsMountStats)]
                parsed += mounts
        if agent.mmpmon_command:
            try:
                done = subprocess.run(
                    agent.mmpmon_command, input=b"fs_io_s\n", capture_output=True, timeout=10, check=True
                )
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("GPFS counters (mmpmon) unreadable: %s", exc)
            else:
                filesystems = parse_mmpmon_fs_io_s(done.stdout, origin=f"{self.node}:mmpmon")
                readings += [gpfs_reading(g) for g in filesystems if isinstance(g, GpfsFsIo)]
                parsed += filesystems
        out: list[AgentRecord] = list(self.fabric.fs_windows(readings, now))
        for rejected in parsed:
            if (
                isinstance(rejected, Rejected)
                and (rejected.record_key, rejected.reason) not in self._rejected_sent
            ):
                self._rejected_sent.add((rejected.record_key, rejected.reason))
                log.warning("%s: %s", rejected.record_key, rejected.reason)
                out.append(rejected)
        return out

    def rediscover(self, force: bool = False) -> None:
        self._discovered_at = self.monotonic()
        try:
            inventory = self.sampler.discover()
        except NvmlError as exc:
            if force:
                raise
            log.warning("GPU discovery failed, keeping the known devices: %s", exc)
            return
        key = _inventory_key(inventory)
        stale = self.monotonic() - self._inventory_spooled_at >= INVENTORY_REFRESH_SECONDS
        if force or key != self._inventory or stale:
            if not force and key != self._inventory:
                log.info("GPU inventory changed: %d devices", len(inventory))
            if not self._append(inventory):
                return
            self._inventory = key
            self._inventory_spooled_at = self.monotonic()
            self.sampler.start_events()
        self.discover_topology(inventory, force=force)

    def discover_topology(self, inventory: Sequence[GpuInventory], force: bool = False) -> None:
        """The GPUs' NVLinks and how each pair is connected; spooled when it changed (daily at least)."""
        bus_ids = {r.gpu_uuid: r.pci_bus_id for r in inventory}
        gpus = [
            discover_nvlinks(
                self.nvml, d.uuid, d.handle, d.index, bus_ids.get(d.uuid, ""), self.sampler.record_error
            )
            for d in self.sampler.devices
            if not d.parent_uuid
        ]
        self._nvlink_gpus = gpus
        if not gpus:
            return
        topology = nvml_topology(
            self.nvml,
            self.node,
            gpus,
            datetime.fromtimestamp(self.clock(), UTC),
            self.sampler.record_error,
        )
        key = _topology_key(topology)
        stale = self.monotonic() - self._topology_spooled_at >= INVENTORY_REFRESH_SECONDS
        if (force or key != self._topology or stale) and self._append([topology]):
            if key != self._topology and self._topology:
                log.info("GPU topology changed: %s", topology.summary)
            self._topology = key
            self._topology_spooled_at = self.monotonic()

    def _append(self, records: Sequence[AgentRecord]) -> bool:
        try:
            self.spool.append_records(records)
        except sqlite3.Error as exc:
            # disk full or I/O error: these records are lost, the agent keeps running
            log.error("spool write failed, %d records lost: %s", len(records), exc)
            self.metrics.spool_errors.inc()
            return False
        return True

    def _spool_summaries(self, summaries: Sequence[GpuSummary]) -> None:
        if summaries and self._append(summaries):
            self.metrics.summaries.inc(len(summaries))

    def _spool_events(self, events: Sequence[GpuEvent]) -> None:
        if events and self._append(events):
            for event in events:
                self.metrics.events.labels(kind=event.kind).inc()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtel-agent",
        description="slurmtel node agent: NVML samples -> summaries -> local spool -> HTTP for the head.",
    )
    parser.add_argument("--version", action="version", version=f"slurmtel-agent {__version__}")
    parser.add_argument(
        "--config",
        default=None,
        help="config file (default: $SLURMTEL_CONFIG, else /etc/slurmtel/slurmtel.toml if present); "
        "the agent reads [agent], [site] and [logging]",
    )
    parser.add_argument(
        "--fake-nvml",
        metavar="CAPTURE",
        default=None,
        help="use a fake NVML built from an nvidia-smi capture (-q, -q -x, or an nvidia_gpu_exporter "
        "capture) instead of the GPU: for demos and tests",
    )
    parser.add_argument(
        "--fake-state",
        choices=("load", "idle"),
        default="load",
        help="which state of an nvidia_gpu_exporter capture to use (default load)",
    )
    parser.add_argument("--log-level", default=None, choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"slurmtel-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_level or config.logging.level.upper())
    nvml: NvmlApi
    if args.fake_nvml:
        from slurmtel.agent.fake_nvml import FakeNvml

        try:
            nvml = FakeNvml.from_capture(args.fake_nvml, state=args.fake_state)
        except (OSError, SlurmtelError) as exc:
            print(f"slurmtel-agent: --fake-nvml {args.fake_nvml}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        from slurmtel.agent.nvml import Nvml

        nvml = Nvml()
    try:
        agent = Agent(config, nvml)
    except (OSError, ConfigError) as exc:  # port in use, spool directory not writable, token unusable
        print(f"slurmtel-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        agent.start()
    except NvmlError as exc:
        print(f"slurmtel-agent: NVML unavailable: {exc}", file=sys.stderr)
        agent.server.stop()
        agent.spool.close()
        return EXIT_ERROR
    notify("READY=1", "STATUS=sampling")
    try:
        agent.run(stop)
    finally:
        notify("STOPPING=1")
        agent.close()
    log.info("stopped at %s", datetime.now(UTC).isoformat())
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
