"""A real Prometheus for the prometheus source's tests: Debian's `prometheus` package
(bookworm: 2.42), started by the test session itself on a loopback port.

No skip: when `prometheus` or `promtool` is missing, the tests install Debian's package as the
Slurm suite installs its own (scripts/ci-slurm-deps.sh, here `... prometheus`) when they run
as root on Debian, and fail with the reason otherwise. CI (.ci/run) installs it up front.

Data comes two ways: backfilled blocks (`promtool tsdb create-blocks-from openmetrics`) of
OpenMetrics text with explicit timestamps, made from real dcgm-exporter captures (exact
instants, so the windows can be compared with the dcgm source's to the value), and a
Prometheus that scrapes a loopback HTTP server serving a capture.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DEPS_SCRIPT = ROOT / "scripts" / "ci-slurm-deps.sh"


def debian_binaries(package: str, *names: str) -> list[str]:
    """The paths of the programs NAMES, installed from Debian's PACKAGE when one is missing and
    the tests run as root on Debian (scripts/ci-slurm-deps.sh PACKAGE); else the test fails."""
    found = [shutil.which(name) for name in names]
    if all(found):
        return [str(path) for path in found]
    if os.geteuid() != 0 or not Path("/etc/debian_version").exists() or not shutil.which("apt-get"):
        pytest.fail(
            f"{', '.join(names)} not installed, and only root on Debian can install them here "
            f"(run: {DEPS_SCRIPT.relative_to(ROOT)} {package})",
            pytrace=False,
        )
    done = subprocess.run(["bash", str(DEPS_SCRIPT), package], capture_output=True, text=True, check=False)
    found = [shutil.which(name) for name in names]
    if done.returncode != 0 or not all(found):
        pytest.fail(f"installing Debian's {package} failed:\n{done.stdout}{done.stderr}", pytrace=False)
    return [str(path) for path in found]


def prometheus_binaries() -> tuple[str, str]:
    """(prometheus, promtool), installed from Debian's package when missing and possible."""
    prometheus, promtool = debian_binaries("prometheus", "prometheus", "promtool")
    return prometheus, promtool


def version() -> str:
    prometheus, _ = prometheus_binaries()
    out = subprocess.run([prometheus, "--version"], capture_output=True, text=True, check=True)
    return (out.stdout + out.stderr).splitlines()[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    # https: the server's (self-signed) certificate
    ca_file: Path | None = None

    def get(self, path: str) -> bytes:
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        with urllib.request.urlopen(self.url + path, timeout=30, context=context) as response:
            body: bytes = response.read()
            return body

    def query_range_requests(self) -> float:
        """How many /api/v1/query_range requests this server has answered (its own metric)."""
        for family in text_string_to_metric_families(self.get("/metrics").decode()):
            for sample in family.samples:
                if (
                    sample.name == "prometheus_http_requests_total"
                    and sample.labels.get("handler") == "/api/v1/query_range"
                ):
                    return float(sample.value)
        return 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_prometheus(
    workdir: Path, *, data: Path, config: str = "global: {}\n", tls: tuple[Path, Path] | None = None
) -> PrometheusServer:
    """Start Prometheus on DATA (a TSDB directory) with the CONFIG (YAML) on a free loopback
    port - https with TLS (certificate, key) - and wait until it says it is ready (or has
    ended: then fail with its log)."""
    prometheus, _ = prometheus_binaries()
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    log = workdir / "prometheus.log"
    port = free_port()
    args = [
        prometheus,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=100y",
        "--log.level=warn",
    ]
    if tls is not None:
        web = workdir / "web.yml"
        web.write_text(f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n")
        args.append(f"--web.config.file={web}")
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    scheme = "https" if tls else "http"
    server = PrometheusServer(f"{scheme}://127.0.0.1:{port}", process, log, tls[0] if tls else None)
    while True:
        if process.poll() is not None:
            pytest.fail(f"prometheus ended (exit {process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if server.get("/-/ready"):
                return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)


def victoria_binary() -> str:
    """victoria-metrics (the single-node server), installed from Debian's package when missing
    and possible, as prometheus_binaries."""
    (binary,) = debian_binaries("victoria-metrics", "victoria-metrics")
    return binary


def start_victoria(workdir: Path) -> PrometheusServer:
    """Start VictoriaMetrics (Debian's victoria-metrics) with its data under WORKDIR on a free
    loopback port, and wait until it answers. Its /api/v1/query_range and label values are the
    Prometheus API the prometheus source and sample store read; load data with import_prometheus."""
    binary = victoria_binary()
    log = workdir / "victoria-metrics.log"
    port = free_port()
    args = [
        binary,
        f"-storageDataPath={workdir / 'vmdata'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        # the data imported is in the past: no point is too fresh to show, none cached
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-loggerLevel=WARN",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    server = PrometheusServer(f"http://127.0.0.1:{port}", process, log)
    while True:
        if process.poll() is not None:
            pytest.fail(f"victoria-metrics ended (exit {process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if server.get("/health"):
                return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)


def import_prometheus(server: PrometheusServer, openmetrics_text: str) -> None:
    """Import OpenMetrics TEXT (openmetrics(): explicit timestamps in seconds) into a
    VictoriaMetrics through /api/v1/import/prometheus (the exposition format, timestamps in
    milliseconds), then flush it so that queries see all of it."""
    lines = []
    for line in openmetrics_text.split("\n"):
        if not line or line.startswith("#"):
            continue
        head, stamp = line.rsplit(" ", 1)
        lines.append(f"{head} {round(float(stamp) * 1000)}")
    body = ("\n".join(lines) + "\n").encode()
    request = urllib.request.Request(server.url + "/api/v1/import/prometheus", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    with urllib.request.urlopen(server.url + "/internal/force_flush", timeout=60) as response:
        response.read()


def self_signed_certificate(workdir: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made with Debian's openssl."""
    (openssl,) = debian_binaries("openssl", "openssl")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        capture_output=True,
        check=True,
    )  # fmt: skip
    return cert, key


def openmetrics(scrapes: Iterable[tuple[datetime, str, Mapping[str, str]]]) -> str:
    """OpenMetrics text with explicit timestamps of SCRAPES: (instant, exposition text of one
    scrape, the labels Prometheus adds to what it scrapes from that target: instance, job).

    Each sample line of a scrape is kept as it is (name, labels, value text), with the target's
    labels added to its label set and the instant appended. Families are listed one after the
    other, as the format requires, each typed gauge (OpenMetrics wants a counter's samples
    named *_total; the type changes nothing that is stored).
    """
    families: dict[str, list[str]] = {}
    for at, text, extra in scrapes:
        added = ",".join(f'{k}="{v}"' for k, v in extra.items())
        for line in text.split("\n"):
            if not line.strip() or line.startswith("#"):
                continue
            if "{" in line:
                name = line[: line.index("{")]
                close = line.rindex("}")
                labelled = f"{line[:close]},{added}{line[close:]}"
            else:
                name, value = line.split(None, 1)
                labelled = f"{name}{{{added}}} {value}"
            families.setdefault(name, []).append(f"{labelled} {at.timestamp():.3f}")
    out = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfill(workdir: Path, text: str) -> Path:
    """A TSDB directory holding the OpenMetrics TEXT as blocks (promtool)."""
    _, promtool = prometheus_binaries()
    source = workdir / "backfill.om"
    source.write_text(text)
    data = workdir / "data"
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"promtool could not backfill:\n{done.stdout}{done.stderr}")
    return data


# ---------------------------------------------------------------- a sequence of real scrapes

CAPTURE = ROOT / "tests" / "fixtures" / "dcgm" / "datadog_dcgm" / "metrics.txt"
# the capture's Tesla T4 with readings (driver 460.106.00 host); its other GPUs carry no
# utilisation (their windows are unmeasured) but are in the inventory
T4 = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
_OTHER_UUIDS = (T4, "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5")
# the capture's last line: an A10G sample edited upstream (fake UUID, DCGM_FI_PROF_DRAM_ACTIVE only)
_EDITED_UPSTREAM = 'UUID="GPU-abc"'
STEP_SECONDS = 30
SCRAPES = 20


def gpu_uuid(uuid: str, node: int) -> str:
    """The UUID of the capture's GPU UUID as installed in node NODE (1: the capture's own)."""
    return uuid if node == 1 else f"{uuid}-n{node}"


def scrape_text(node: int, k: int) -> str:
    """Scrape K (0, 1, ...) of node NODE: the real capture's text with the T4's utilisation,
    memory, power and energy readings set to the K-th values of a made-up load (the values
    only: every line, label and the rest of the text as captured; the file is never edited).
    Node 2, 3, ... hold the same GPUs under other UUIDs. Scrape 7 has DCGM's impossible
    4294967295 utilisation (dropped by both paths), scrapes 0 and 11 are idle. The capture's
    upstream-edited A10G line is left out: a GPU seen only through a field the prometheus
    source does not ask for (DRAM_ACTIVE) is a GPU only the dcgm source sees."""
    util = 4294967295 if k == 7 else (k * 37 + node) % 101
    used_mib = 1000 + 250 * k + node
    power = 20.5 + k + node / 10
    energy_mj = 128996013 + sum(round((20.5 + i + node / 10) * STEP_SECONDS * 1000) for i in range(k))
    readings = {
        "DCGM_FI_DEV_GPU_UTIL": str(util),
        "DCGM_FI_DEV_FB_USED": str(used_mib),
        "DCGM_FI_DEV_FB_FREE": str(15109 - used_mib),
        "DCGM_FI_DEV_POWER_USAGE": f"{power:.6f}",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(energy_mj),
    }
    lines = []
    for line in CAPTURE.read_text().split("\n"):
        if _EDITED_UPSTREAM in line:
            continue
        name = line.split("{", 1)[0]
        if name in readings and f'UUID="{T4}"' in line:
            line = line.rsplit(" ", 1)[0] + " " + readings[name]
        lines.append(line)
    text = "\n".join(lines)
    if node != 1:
        for uuid in _OTHER_UUIDS:
            text = text.replace(f'UUID="{uuid}"', f'UUID="{gpu_uuid(uuid, node)}"')
    return text


def node_name(node: int) -> str:
    return f"gpu{node:02d}"


def target_labels(node: int) -> dict[str, str]:
    """The labels Prometheus gives what it scrapes from node NODE's dcgm-exporter."""
    return {"instance": f"{node_name(node)}:9400", "job": "dcgm"}


def sequence(start: datetime, nodes: int = 2) -> list[tuple[datetime, str, Mapping[str, str]]]:
    """SCRAPES scrapes of each node, STEP_SECONDS apart from START."""
    return [
        (start + timedelta(seconds=STEP_SECONDS * k), scrape_text(node, k), target_labels(node))
        for k in range(SCRAPES)
        for node in range(1, nodes + 1)
    ]
