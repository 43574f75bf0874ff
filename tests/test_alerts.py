"""The Prometheus alerting rules of config/alerts/: valid (`promtool check rules`), each alert
firing and not firing as its unit tests say (`promtool test rules tests/alerts/*.yml`), and
every metric they read one the daemon exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from slurmtel.actions.metrics import GaugeSnapshot
from slurmtel.metrics import DaemonMetrics
from tests.prometheus_server import debian_binaries

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "config" / "alerts").glob("*.yml"))
UNIT_TESTS = sorted((ROOT / "tests" / "alerts").glob("*.yml"))


def promtool() -> str:
    (path,) = debian_binaries("prometheus", "promtool")
    return path


def test_the_rules_are_valid() -> None:
    assert RULES, "no config/alerts/*.yml"
    done = subprocess.run(
        [promtool(), "check", "rules", *map(str, RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 14 rules found" in done.stdout


def test_each_alert_fires_and_does_not_as_its_unit_tests_say() -> None:
    assert UNIT_TESTS
    done = subprocess.run(
        [promtool(), "test", "rules", *map(str, UNIT_TESTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", "".join(p.read_text() for p in UNIT_TESTS)))
    defined = set(re.findall(r"- alert: (\w+)", "".join(p.read_text() for p in RULES)))
    assert tested == defined, f"alerts without a unit test: {defined - tested}"
    for test_file in UNIT_TESTS:
        text = test_file.read_text()
        for alert in defined:
            # each alert both fires (an expected alert) and is checked not to (exp_alerts: [])
            blocks = re.findall(
                rf"alertname: {alert}\n\s+exp_alerts:(.*?)(?=\n\s+- eval_time|\n\s*\n|\Z)", text, re.S
            )
            assert any(b.strip() == "[]" for b in blocks), f"{alert}: never checked not to fire"
            assert any(b.strip() != "[]" for b in blocks), f"{alert}: never checked to fire"


def exported() -> set[str]:
    metrics = DaemonMetrics(["sacct"])
    metrics.actions.set_snapshot(
        GaugeSnapshot(
            node_idle_gpus={"gpu01": 1},
            node_no_process_gpus={"gpu01": 1},
            job_idle_gpus={("lab", "7", "gpu"): 1},
            job_idle_seconds={("lab", "7", "gpu"): 60.0},
            node_events={("gpu01", "xid"): 1},
        )
    )
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        names.update(s.name for s in family.samples)
    return names


def test_every_metric_the_rules_read_is_exported_by_the_daemon() -> None:
    expressions = "\n".join(
        line.split("expr:", 1)[1]
        for path in RULES
        for line in path.read_text().splitlines()
        if "expr:" in line
    )
    read = set(re.findall(r"\bslurmtel_[a-z0-9_]+", expressions))
    assert read, "no metric read"
    assert read <= exported(), f"not exported by the daemon: {read - exported()}"
