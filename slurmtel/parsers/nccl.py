"""nccl-tests / rccl-tests console output -> NcclRun records (acceptance runs of the fabric).

Every published format is read by the same line classifier: nccl-tests 1.x ("NCCL Tests
compiled with NCCL 1.0", `bytes N type op ... res`), the 2.x tables with the older `error`
column (largest relative error) or `#wrong` (count of wrong values), with or without `redop`
and `root` columns, `Rank N [Group G] [Pid P] on HOST device D [PCI] MODEL` lines with the PCI
id as `0x35`, `0000:04:00` or `0000:05:00.0` and with or without a model, the 2.17+
`# nccl-tests version` / `# Collective test starting` lines, and rccl-tests' `rccl-tests:
Version` / `RCCL version :` block. Interleaved noise is skipped: NCCL INFO/WARN lines inside
the table, Open MPI `[1,0]<stdout>:` and srun `--label` prefixes, ANSI escapes, CRLF, shell
prompts, the "Enabled NCCL Func/Proto/Algo Matrix". One log may hold several runs (a job
script that runs all_reduce, then all_gather, ...): each `# nThread` header, version line or
rank list after a finished table starts the next run.

Status (see records.NcclRun): "failed" for wrong data (#wrong > 0, out-of-bounds FAILED), a
failure banner (a rank's NCCL/CUDA failure, mpirun/srun aborts) or no measured size;
"degraded" for a missing footer, cut-off or unreadable rows; else "ok". Text that holds no
nccl-tests output at all is one Rejected record.

Pure: text in, records out; no file, clock or command.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from slurmtel.records import NcclRank, NcclRun, NcclSizeResult, Rejected

SOURCE = "nccl"
# how much of an unreadable log a Rejected record keeps
RAW_CHARS = 16384

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Open MPI --tag-output, Intel MPI -prepend-rank, srun --label
_LINE_PREFIXES = (
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:\s?"),
    re.compile(r"^\[\d+\] (?=\S)"),
    re.compile(r"^\s*\d{1,6}: "),
)
_HEADER = re.compile(r"\bnThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_STEP = re.compile(r"\bstep:\s*(\d+)\((factor|bytes)\)")
_WARMUP = re.compile(r"\bwarmup iters:\s*(\d+)")
_ITERS = re.compile(r"(?<=\d )iters:\s*(\d+)")
_VALIDATION = re.compile(r"\bvalidation:\s*(\d+)")
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+)(?:\s+nccl-headers=(\d+))?(?:\s+nccl-library=(\d+))?")
_RCCL_TESTS = re.compile(r"rccl-tests: Version (\S+)")
_NCCL_VERSION = re.compile(r"\bNCCL version (\d+\.\d+(?:\.\d+)?)")
_COMPILED_WITH = re.compile(r"NCCL Tests compiled with NCCL (\d+(?:\.\d+)*)")
_RCCL_VERSION = re.compile(r"^RCCL version\s*:\s*(\d+\.\d+(?:\.\d+)?)")
_COLLECTIVE_MARK = re.compile(r"Collective test (starting|concluded):\s*(\S+)")
_PERF_BINARY = re.compile(r"(?:^|[\s/])([a-z]+(?:_[a-z]+)*)_perf(?:_mpi)?\b")
_RANK = re.compile(
    r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
# NCCL's own log lines: "host:pid:tid [dev] NCCL INFO ..."
_NCCL_LOG = re.compile(r"^\S+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN|ERROR|TRACE|ABORT)\b")
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_REDUCING = re.compile(r"Reducing maxBytes to (\d+)")
_INT = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")

# failure banners: (pattern, group holding the host or None)
_FAILURES: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"^(?P<host>\S+): Test (?:NCCL|CUDA|HIP|Cuda) failure \S+ '.*'"), "host"),
    (re.compile(r"^\s*\.\. (?P<host>\S+) pid \d+: Test failure \S+"), "host"),
    (re.compile(r"^(?:NCCL|CUDA|Cuda|HIP) failure \S+ '.*'"), None),
    (re.compile(r"\bTest (?:NCCL|CUDA|HIP) failure\b"), None),
    (re.compile(r"Primary job\s+terminated normally, but \d+ process(?:es)? returned"), None),
    (re.compile(r"process rank \d+ with PID \d+ on node (?P<host>\S+) exited on signal"), "host"),
    (re.compile(r"\bMPI_ABORT was invoked on rank \d+"), None),
    (re.compile(r"^srun: error: (?P<host>[^\s:]+): tasks? [\d,\-]+: (?!Exited with exit code 0\b)"), "host"),
    (re.compile(r"\*\*\* (?:STEP|JOB) \S+ ON (?P<host>\S+) CANCELLED AT .*DUE TO"), "host"),
    (re.compile(r"\b(?:Segmentation fault|Bus error)\b.*\(core dumped\)|^Segmentation fault"), None),
    (re.compile(r"^terminate called after throwing"), None),
)

_FACTOR_TOLERANCE = 0.03


@dataclass
class _Table:
    # column names before the first "time": size, count, type, and redop / root (or op)
    lead: list[str]
    # measurement groups (out-of-place, in-place) and the name of each group's check column
    checks: list[str]

    @property
    def has_redop(self) -> bool:
        return any(c in ("redop", "op") for c in self.lead)

    @property
    def has_root(self) -> bool:
        return "root" in self.lead


@dataclass
class _Builder:
    """What one run has shown so far."""

    seen: set[str] = field(default_factory=set)
    tool: str = "nccl-tests"
    library: str = ""
    tests_version: str = ""
    nccl_version: str = ""
    nccl_version_from_library: bool = False
    collective: str = ""
    command_collective: str = ""
    header: dict[str, int] = field(default_factory=dict)
    step: tuple[int, str] | None = None
    validation: bool | None = None
    ranks: list[NcclRank] = field(default_factory=list)
    table: _Table | None = None
    rows: list[NcclSizeResult] = field(default_factory=list)
    bad_rows: list[str] = field(default_factory=list)
    out_of_bounds: tuple[int, str] | None = None
    avg_busbw: float | None = None
    avg_text: str = ""
    failures: list[str] = field(default_factory=list)
    failed_hosts: list[str] = field(default_factory=list)

    @property
    def finished_table(self) -> bool:
        return bool(self.rows) or self.avg_busbw is not None or bool(self.avg_text)

    @property
    def table_closed(self) -> bool:
        """The table ended: its footer was read."""
        return self.avg_text != "" or self.out_of_bounds is not None

    @property
    def has_content(self) -> bool:
        return bool(
            self.header or self.ranks or self.table or self.tests_version or self.collective or self.rows
        )


def parse_nccl_tests(raw: str | bytes, *, origin: str = "<input>") -> list[NcclRun | Rejected]:
    """The runs in one nccl-tests / rccl-tests log, in order; a Rejected record when there is none."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    runs: list[_Builder] = []
    current = _Builder()
    pending_collective = ""
    for lineno, original in enumerate(text.splitlines(), start=1):
        line = _clean(original)
        if not line.strip():
            continue
        marker = _marker(line)
        if marker is None and current.finished_table and (_RANK.match(line) or _table_header(line)):
            marker = "again"  # a rank list or table after a finished table: the next run
        if marker is not None:
            if current.finished_table or marker in current.seen:
                if current.has_content:
                    runs.append(current)
                current = _Builder(command_collective=pending_collective)
                pending_collective = ""
            current.seen.add(marker)
        if _NCCL_LOG.match(line):
            _nccl_log_line(current, line)
            continue
        if _apply_versions(current, line):
            continue
        if (m := _COLLECTIVE_MARK.search(line)) is not None:
            name = _collective_of_binary(m.group(2))
            if m.group(1) == "starting":
                current.collective = name or current.collective
            else:
                current.collective = current.collective or name
            continue
        if (m := _HEADER.search(line)) is not None:
            _apply_header(current, line, m)
            continue
        if (m := _RANK.match(line)) is not None:
            current.ranks.append(_rank(m))
            continue
        if (table := _table_header(line)) is not None:
            current.table = table
            continue
        if (m := _OUT_OF_BOUNDS.search(line)) is not None:
            current.out_of_bounds = (int(m.group(1)), m.group(2))
            continue
        if (m := _AVG_BUSBW.search(line)) is not None:
            current.avg_text = m.group(1)
            current.avg_busbw = _float(m.group(1))
            continue
        if (m := _REDUCING.search(line)) is not None:
            current.header["max_bytes"] = int(m.group(1))
            continue
        if _failure(current, line):
            continue
        stripped = line.strip()
        if current.table is not None and not current.table_closed and stripped[:1].isdigit():
            row = _row(current.table, stripped)
            if row is None:
                current.bad_rows.append(f"line {lineno}: {stripped[:120]}")
            else:
                current.rows.append(row)
            continue
        if (m := _PERF_BINARY.search(line)) is not None and not line.lstrip().startswith("#"):
            name = _collective_of_binary(m.group(1) + "_perf")
            if current.finished_table:
                pending_collective = name
            elif not current.command_collective:
                current.command_collective = name
    if current.has_content:
        runs.append(current)
    if not runs:
        return [
            Rejected(
                source=SOURCE,
                origin=origin,
                record_key="log",
                reason="no nccl-tests or rccl-tests output: no '# nThread' header, rank lines or results table",
                raw=text[:RAW_CHARS],
            )
        ]
    return [_run(index, builder) for index, builder in enumerate(runs)]


# ------------------------------------------------------------------------------- line level


def _clean(line: str) -> str:
    line = _ANSI.sub("", line).replace("\r", "").rstrip()
    for prefix in _LINE_PREFIXES:
        line = prefix.sub("", line, count=1)
    return line


def _marker(line: str) -> str | None:
    """The kind of line that can only start a run (or belong to one run once)."""
    if _TESTS_VERSION.search(line) or _RCCL_TESTS.search(line):
        return "version"
    if (m := _COLLECTIVE_MARK.search(line)) is not None and m.group(1) == "starting":
        return "starting"
    if _HEADER.search(line):
        return "header"
    return None


def _apply_versions(run: _Builder, line: str) -> bool:
    if (m := _TESTS_VERSION.search(line)) is not None:
        run.tool = "nccl-tests"
        run.tests_version = m.group(1)
        if m.group(3):
            run.nccl_version = _nccl_code(int(m.group(3)))
            run.nccl_version_from_library = True
        elif m.group(2) and not run.nccl_version:
            run.nccl_version = _nccl_code(int(m.group(2)))
        run.library = run.library or "nccl"
        return True
    if (m := _RCCL_TESTS.search(line)) is not None:
        run.tool = "rccl-tests"
        run.library = "rccl"
        run.tests_version = m.group(1)
        return True
    if (m := _RCCL_VERSION.match(line)) is not None:
        run.tool = "rccl-tests"
        run.library = "rccl"
        run.nccl_version = m.group(1)
        run.nccl_version_from_library = True
        return True
    if (m := _COMPILED_WITH.search(line)) is not None:
        run.nccl_version = run.nccl_version or m.group(1)
        run.library = run.library or "nccl"
        return True
    if (m := _NCCL_VERSION.search(line)) is not None and not _NCCL_LOG.match(line):
        if not run.nccl_version_from_library:
            run.nccl_version = m.group(1)
        run.library = run.library or "nccl"
        return True
    return False


def _nccl_log_line(run: _Builder, line: str) -> None:
    # NCCL 2.20+ prints its version only as an INFO line
    m = _NCCL_VERSION.search(line)
    if m is not None and not run.nccl_version_from_library and not run.nccl_version:
        run.nccl_version = m.group(1)
        run.library = run.library or "nccl"


def _nccl_code(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.29.2": major*10000 + minor*100 + patch since 2.9, else *1000."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _apply_header(run: _Builder, line: str, m: re.Match[str]) -> None:
    run.header.update(
        threads=int(m.group(1)), gpus=int(m.group(2)), min_bytes=int(m.group(3)), max_bytes=int(m.group(4))
    )
    if (s := _STEP.search(line)) is not None:
        run.step = (int(s.group(1)), s.group(2))
    if (w := _WARMUP.search(line)) is not None:
        run.header["warmup"] = int(w.group(1))
    if (i := _ITERS.search(line)) is not None:
        run.header["iters"] = int(i.group(1))
    if (v := _VALIDATION.search(line)) is not None:
        run.validation = v.group(1) != "0"


def _rank(m: re.Match[str]) -> NcclRank:
    pci = m.group(6).strip()
    return NcclRank(
        rank=int(m.group(1)),
        group=int(m.group(2)) if m.group(2) else None,
        pid=int(m.group(3)) if m.group(3) else None,
        host=m.group(4),
        device=int(m.group(5)),
        pci_id=pci,
        pci_bus_id=normalize_pci_bus_id(pci),
        gpu_model=m.group(7).strip(),
    )


def normalize_pci_bus_id(text: str) -> str:
    """A PCI id as NVML prints it ("00000000:04:00.0"), from "0000:04:00", "0000:05:00.0",
    "00000000:C2:00.0"; "" for a form without a domain ("0x35": the bus alone)."""
    m = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?", text.strip())
    if m is None:
        return ""
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function or '0')}"


def _table_header(line: str) -> _Table | None:
    tokens = line.lstrip("#").split()
    if "busbw" not in tokens or "time" not in tokens or not ({"size", "bytes"} & set(tokens)):
        return None
    first_time = tokens.index("time")
    lead = tokens[:first_time]
    if len(lead) < 3:
        return None
    checks = []
    for i, token in enumerate(tokens):
        if token == "busbw":
            checks.append(tokens[i + 1].lstrip("#") if i + 1 < len(tokens) else "")
    return _Table(lead=lead, checks=checks)


def _number(token: str) -> float | None:
    """A measured value; None for N/A. Raises ValueError for anything else."""
    if token.upper() == "N/A":
        return None
    value = float(token.rstrip("*"))
    if math.isnan(value):
        return None
    return value


def _float(token: str) -> float | None:
    try:
        return _number(token)
    except ValueError:
        return None


def _row(table: _Table, text: str) -> NcclSizeResult | None:
    """One data row, or None when it does not fit the table (cut off, interleaved output)."""
    tokens = text.split()
    groups = len(table.checks)
    middle = len(tokens) - 3 - 4 * groups
    expected_middle = len(table.lead) - 3
    if groups == 0 or middle < 0 or middle > expected_middle:
        return None
    if not (_INT.fullmatch(tokens[0]) and _INT.fullmatch(tokens[1])) or _INT.fullmatch(tokens[2]):
        return None
    redop, root = "", None
    cells = tokens[3 : 3 + middle]
    # a full row names its cells by the header; a short one left a cell blank (alltoall's redop
    # before 2.10): then a number is the root and a word the reduction
    names = (
        table.lead[3:]
        if middle == expected_middle
        else ["root" if _SIGNED.fullmatch(c) else "redop" for c in cells]
    )
    for name, cell in zip(names, cells, strict=True):
        if name == "root":
            if not _SIGNED.fullmatch(cell):
                return None
            root = int(cell)
        else:
            redop = cell
    measured = tokens[3 + middle :]
    values: dict[str, float | int | None] = {}
    try:
        for g, name in enumerate(("out_of_place", "in_place")[:groups]):
            time_text, algbw, busbw, check = measured[4 * g : 4 * g + 4]
            values[f"{name}_time_microseconds"] = _number(time_text)
            values[f"{name}_algbw_gbps"] = _number(algbw)
            values[f"{name}_busbw_gbps"] = _number(busbw)
            kind = table.checks[g]
            if kind == "wrong":
                if check.upper() == "N/A":
                    values[f"{name}_wrong"] = None
                elif re.fullmatch(r"\d+\*?", check):
                    values[f"{name}_wrong"] = int(check.rstrip("*"))
                else:
                    return None
            else:  # "error" (2.x before #wrong) or "res" (1.x): the largest relative error
                values[f"{name}_error"] = _number(check)
    except ValueError:
        return None
    return NcclSizeResult(
        size_bytes=int(tokens[0]),
        count_elements=int(tokens[1]),
        data_type=tokens[2],
        redop=redop,
        root=root,
        **values,  # type: ignore[arg-type]
    )


def _failure(run: _Builder, line: str) -> bool:
    for pattern, host_group in _FAILURES:
        m = pattern.search(line)
        if m is None:
            continue
        run.failures.append(line.strip()[:300])
        if host_group is not None:
            host = m.group(host_group)
            if host not in run.failed_hosts:
                run.failed_hosts.append(host)
        return True
    return False


def _collective_of_binary(name: str) -> str:
    """ "all_reduce_perf" -> "all_reduce"; "alltoall_perf" -> "alltoall"."""
    name = name.strip().rsplit("/", 1)[-1]
    if name.endswith("_perf_mpi"):
        name = name[: -len("_mpi")]
    if not name.endswith("_perf"):
        return ""
    return name[: -len("_perf")]


# ------------------------------------------------------------------------------- run level


def _run(index: int, b: _Builder) -> NcclRun:
    rows = b.rows
    reasons: list[str] = []
    failed = False
    degraded = False
    wrong_sizes = [r for r in rows if (r.out_of_place_wrong or 0) + (r.in_place_wrong or 0) > 0]
    wrong_values = sum((r.out_of_place_wrong or 0) + (r.in_place_wrong or 0) for r in rows)
    if wrong_sizes:
        failed = True
        reasons.append(
            f"{wrong_values} wrong values (#wrong) at {len(wrong_sizes)} of {len(rows)} sizes "
            f"({wrong_sizes[0].size_bytes}..{wrong_sizes[-1].size_bytes} bytes)"
        )
    if b.out_of_bounds is not None and b.out_of_bounds[1] == "FAILED":
        failed = True
        reasons.append(f"out of bounds values: {b.out_of_bounds[0]} FAILED")
    if b.failures:
        failed = True
        where = f" on {', '.join(b.failed_hosts)}" if b.failed_hosts else ""
        reasons.append(f"a rank failed{where}: {b.failures[0]}")
    if not rows:
        failed = True
        reasons.append("no message size was measured")
    footer = b.out_of_bounds is not None or b.avg_text != ""
    if rows and not footer:
        degraded = True
        expected = _expected_sizes(b)
        of = f" of {expected}" if expected is not None and expected > len(rows) else ""
        reasons.append(
            f"no footer (Out of bounds values / Avg bus bandwidth): the log ends after {len(rows)}{of} sizes"
        )
    if b.bad_rows:
        degraded = True
        reasons.append(f"{len(b.bad_rows)} unreadable table row(s), first {b.bad_rows[0]}")
    if footer and rows and b.avg_busbw is None:
        degraded = True
        reasons.append(f"average bus bandwidth is not a number: {b.avg_text!r}")
    status = "failed" if failed else "degraded" if degraded else "ok"

    avg: float | None
    if b.avg_busbw is not None:
        avg, avg_source = b.avg_busbw, "footer"
    else:
        measured = [
            v for r in rows for v in (r.out_of_place_busbw_gbps, r.in_place_busbw_gbps) if v is not None
        ]
        avg = round(sum(measured) / len(measured), 6) if measured else None
        avg_source = "computed" if avg is not None else ""
    peaks = [r.out_of_place_busbw_gbps for r in rows if r.out_of_place_busbw_gbps is not None]
    hosts = tuple(dict.fromkeys(r.host for r in b.ranks))
    models = Counter(r.gpu_model for r in b.ranks if r.gpu_model)
    if len(models) > 1:
        gpu_model = "mixed: " + ", ".join(m for m, _ in models.most_common())
    else:
        gpu_model = next(iter(models), "")
    collective, source = b.collective or b.command_collective, "log"
    if not collective:
        collective = _infer_collective(b)
        source = "table" if collective else ""
    return NcclRun(
        index=index,
        tool=b.tool,
        collective=collective,
        collective_source=source,
        status=status,
        reasons=tuple(reasons),
        tests_version=b.tests_version,
        nccl_version=b.nccl_version,
        library=b.library or ("rccl" if b.tool == "rccl-tests" else "nccl" if b.nccl_version else ""),
        ranks=len(b.ranks) or None,
        hosts=hosts,
        gpu_model=gpu_model,
        rank_devices=tuple(b.ranks),
        results=tuple(rows),
        avg_busbw_gbps=avg,
        avg_busbw_source=avg_source,
        peak_busbw_gbps=max(peaks) if peaks else None,
        wrong_values=wrong_values,
        out_of_bounds_values=b.out_of_bounds[0] if b.out_of_bounds else None,
        footer_seen=footer,
        failed_hosts=tuple(b.failed_hosts),
        validation=b.validation,
        threads=b.header.get("threads"),
        gpus_per_process=b.header.get("gpus"),
        min_bytes=b.header.get("min_bytes"),
        max_bytes=b.header.get("max_bytes"),
        iterations=b.header.get("iters"),
        warmup_iterations=b.header.get("warmup"),
    )


def _expected_sizes(b: _Builder) -> int | None:
    lo, hi = b.header.get("min_bytes"), b.header.get("max_bytes")
    if lo is None or hi is None or b.step is None or hi < lo:
        return None
    step, kind = b.step
    if kind == "bytes":
        return (hi - lo) // step + 1 if step > 0 else None
    if step <= 1 or lo <= 0:
        return None
    count, size = 0, lo
    while size <= hi and count < 10_000:
        count += 1
        size *= step
    return count


def _infer_collective(b: _Builder) -> str:
    """The collective a table must come from, where that is certain (logs without a name:
    old versions, trimmed logs); "" otherwise. busbw = algbw x 2(n-1)/n for all_reduce,
    (n-1)/n for all_gather / reduce_scatter / alltoall, 1 for broadcast / reduce / sendrecv;
    two ranks are ambiguous (2(n-1)/n = 1)."""
    table = b.table
    if table is None or not b.rows:
        return ""
    n = len(b.ranks)
    factor = None
    for r in reversed(b.rows):
        if r.out_of_place_algbw_gbps and r.out_of_place_busbw_gbps is not None:
            factor = r.out_of_place_busbw_gbps / r.out_of_place_algbw_gbps
            break

    def near(value: float) -> bool:
        return factor is not None and abs(factor - value) <= _FACTOR_TOLERANCE * value

    if n > 2 and near(2 * (n - 1) / n):
        return "all_reduce"
    if table.has_redop and not any(r.redop for r in b.rows):
        return "alltoall"  # 2.x before 2.10 printed an empty redop cell for alltoall
    if not table.has_redop and not table.has_root and n > 1 and near((n - 1) / n):
        return "all_gather"
    if table.has_root and not table.has_redop and near(1.0):
        return "broadcast"
    # 2.x with both cells: only sendrecv moves data with a reduction named, no root and busbw
    # = algbw on more than two ranks (all_reduce: 2(n-1)/n; reduce, broadcast: a root >= 0)
    reductions = {r.redop for r in b.rows}
    if (
        n > 2
        and table.has_redop
        and table.has_root
        and "none" not in reductions
        and all(r.root == -1 for r in b.rows)
        and near(1.0)
    ):
        return "sendrecv"
    return ""


__all__ = ["normalize_pci_bus_id", "parse_nccl_tests"]
