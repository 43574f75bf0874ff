"""CPU seconds beside wall seconds, so that a benchmark's figures hold on a busy machine.

Wall time on a shared machine measures the machine as much as the code: the same run printed
"met" on a quiet head node and "not met" on a busy one. CPU seconds move much less with what
else runs. A section measured here gives:

- wall: perf_counter seconds;
- client: CPU seconds of this process (all its threads) and of the children it waited for
  (getrusage RUSAGE_SELF + RUSAGE_CHILDREN: the CLI runs of a benchmark count);
- backend: CPU seconds (utime + stime from /proc/<pid>/stat) of the PostgreSQL backends of
  the benchmark's database (pg_stat_activity of current_database(): every pooled connection,
  found at the start and at the end of the section; a backend that exits inside the section
  is not counted). Only when the server runs on this machine: otherwise None, printed as
  "backend CPU not measured";
- server: CPU seconds of other processes named by pid (e.g. a Prometheus the benchmark
  started), None when there are none.

    meter = Meter(engine)
    with meter.measure() as m:
        ...
    print(f"ingest: {m.usage}")          # 1.23 s wall, 0.98 s CPU (client 0.50 + backend 0.48)
    print(ratios("ingest / COPY", m.usage, copy.usage))
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

TICKS = os.sysconf("SC_CLK_TCK")
LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}
NOT_MEASURED = "backend CPU not measured"


def client_cpu() -> float:
    """CPU seconds of this process and of its children waited for, so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _stat(pid: int, proc: Path, comm: str | None) -> list[str] | None:
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = raw[raw.find("(") + 1 : raw.rfind(")")]
    if comm is not None and not name.startswith(comm):
        return None
    # fields[0] is field 3 (state) of proc(5)
    return raw[raw.rfind(")") + 2 :].split()


def process_cpu(pid: int, *, proc: Path = Path("/proc"), comm: str | None = None) -> float | None:
    """utime + stime of PID in seconds; None when it is not readable here (or its command name is
    not COMM: a pid of another machine or namespace)."""
    fields = _stat(pid, proc, comm)
    # utime is field 14 of proc(5), stime field 15
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


def exited_children_cpu(pid: int, *, proc: Path = Path("/proc")) -> tuple[int, float] | None:
    """(the parent's pid, cutime + cstime of that parent): the CPU seconds of the parent's children
    that have exited and been waited for. For a backend, its parent is the postmaster."""
    fields = _stat(pid, proc, "postgres")
    if fields is None:
        return None
    parent = _stat(int(fields[1]), proc, "postgres")  # ppid is field 4
    # cutime is field 16, cstime field 17
    return None if parent is None else (int(fields[1]), (int(parent[13]) + int(parent[14])) / TICKS)


@dataclass(frozen=True)
class Usage:
    """What one section cost: wall seconds and CPU seconds (None: not measured)."""

    wall: float
    client: float
    backend: float | None = None
    server: float | None = None
    # a section that used no database (a parser, an HTTP server): no backend to measure
    no_database: bool = False

    @property
    def cpu(self) -> float:
        """Client + backend + server CPU seconds (those measured)."""
        return self.client + (self.backend or 0.0) + (self.server or 0.0)

    def __add__(self, other: Usage) -> Usage:
        def both(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        return Usage(
            self.wall + other.wall,
            self.client + other.client,
            both(self.backend, other.backend),
            both(self.server, other.server),
            self.no_database and other.no_database,
        )

    def in_ms(self) -> str:
        """The same figures in milliseconds: a few ms rounded to 0.001 s hides what is measured."""
        return f"{self.wall * 1000:.2f} ms wall, {self.cpu * 1000:.2f} ms CPU ({self._parts(1000)})"

    def __str__(self) -> str:
        tail = "" if self.backend is not None or self.no_database else f"; {NOT_MEASURED}"
        return f"{self.wall:.3f} s wall, {self.cpu:.3f} s CPU ({self._parts(1)}{tail})"

    def _parts(self, scale: int) -> str:
        """'client C + backend B + server S' (those measured), each times SCALE."""
        parts = [f"client {self.client * scale:.2f}"]
        if self.backend is not None:
            parts.append(f"backend {self.backend * scale:.2f}")
        if self.server is not None:
            parts.append(f"server {self.server * scale:.2f}")
        return " + ".join(parts)


def ratios(label: str, a: Usage, b: Usage) -> str:
    """'LABEL: wall 1.23x, CPU 0.98x': A over B by wall and by CPU seconds."""
    wall = a.wall / b.wall if b.wall > 0 else float("inf")
    cpu = a.cpu / b.cpu if b.cpu > 0 else float("inf")
    return f"{label}: wall {wall:.2f}x, CPU {cpu:.2f}x"


def rate_ratios(label: str, a: Usage, b: Usage) -> str:
    """'LABEL: wall 0.27, CPU 0.28': the rate of A over the rate of B for the same work (B's
    seconds over A's), by wall and by CPU seconds."""
    wall = b.wall / a.wall if a.wall > 0 else float("inf")
    cpu = b.cpu / a.cpu if a.cpu > 0 else float("inf")
    return f"{label}: wall {wall:.2f}, CPU {cpu:.2f}"


@dataclass
class Section:
    """A measured section; usage is set when it ends."""

    usage: Usage = field(default_factory=lambda: Usage(0.0, 0.0))


class Meter:
    """Measures sections of a benchmark: this process, the PostgreSQL backends of ENGINE's
    database when the server is local, and the processes SERVER_PIDS names.

    EXITED_BACKENDS: also count the backends that exit inside a section (a command run as a
    process opens and closes its own connection): the postmaster's waited-for children's CPU.
    That is every database's, so another session's backend ending meanwhile counts too: use it
    only where the commands measured are subprocesses, on a machine otherwise quiet."""

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        server_pids: Callable[[], Iterable[int]] | Iterable[int] = (),
        proc: Path = Path("/proc"),
        exited_backends: bool = False,
    ) -> None:
        self.engine = engine
        self.proc = proc
        self.exited_backends = exited_backends
        self._server_pids = server_pids if callable(server_pids) else (lambda pids=list(server_pids): pids)
        self.local = engine is not None and make_url(engine.url).host in LOCAL_HOSTS

    def _backends(self) -> dict[int, float] | None:
        if self.engine is None or not self.local:
            return None
        with self.engine.connect() as conn:
            pids = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
            seen = {pid: process_cpu(pid, proc=self.proc, comm="postgres") for pid in pids}
        if not seen or any(cpu is None for cpu in seen.values()):
            # a backend's /proc is not this machine's: the server is elsewhere (or in a container)
            return None
        found = {pid: cpu for pid, cpu in seen.items() if cpu is not None}
        if self.exited_backends:
            exited = exited_children_cpu(next(iter(found)), proc=self.proc)
            if exited is None:
                return None
            # under the postmaster's pid, negated: no backend has it
            found[-exited[0]] = exited[1]
        return found

    def _servers(self) -> dict[int, float] | None:
        pids = list(self._server_pids())
        if not pids:
            return None
        return {pid: cpu for pid in pids if (cpu := process_cpu(pid, proc=self.proc)) is not None}

    def start(self) -> Running:
        """A section that runs until its stop()."""
        return Running(self)

    @contextmanager
    def measure(self) -> Iterator[Section]:
        section = Section()
        running = self.start()
        yield section
        section.usage = running.stop()


class Running:
    """A section started by Meter.start(); stop() gives its Usage."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.backends0 = meter._backends()
        self.servers0 = meter._servers()
        self.client0 = client_cpu()
        self.wall0 = time.perf_counter()

    def stop(self) -> Usage:
        wall = time.perf_counter() - self.wall0
        client = client_cpu() - self.client0
        backends1 = self.meter._backends()
        servers1 = self.meter._servers()
        backend = None
        if self.backends0 is not None and backends1 is not None:
            # a backend first seen at the end started inside the section: all its CPU counts
            backend = sum(cpu - self.backends0.get(pid, 0.0) for pid, cpu in backends1.items())
        server = None
        if self.servers0 is not None and servers1 is not None:
            server = sum(cpu - self.servers0.get(pid, 0.0) for pid, cpu in servers1.items())
        return Usage(wall, client, backend, server, self.meter.engine is None)


def run_cpu_line(usage: Usage) -> str:
    """The line every benchmark ends with: the whole run's wall and CPU seconds."""
    return f"whole run: {usage}"
