"""The systemd units in systemd/: systemd's own verifier and its security review.

`systemd-analyze verify` checks every directive and the ExecStart binary (the units are
copied with ExecStart pointing at this environment's entry points); `systemd-analyze
security --offline=yes` (systemd >= 250) scores the hardening. Without systemd-analyze these
tests skip with the reason; SLURMTEL_REQUIRE_SYSTEMD=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
HEAD, AGENT, SERVE = "slurmtel.service", "slurmtel-agent.service", "slurmtel-serve.service"
# the highest "overall exposure level" each unit may have (0 = locked down, 10 = exposed)
EXPOSURE_LIMIT = {HEAD: 2.0, AGENT: 2.5, SERVE: 2.0}


def systemd_analyze(min_version: int = 0) -> str:
    path = shutil.which("systemd-analyze")
    required = os.environ.get("SLURMTEL_REQUIRE_SYSTEMD") == "1"
    if path is None:
        message = "systemd-analyze is not installed (Debian/Ubuntu: apt-get install systemd)"
        if required:
            pytest.fail(message + " and SLURMTEL_REQUIRE_SYSTEMD=1")
        pytest.skip(message + "; SLURMTEL_REQUIRE_SYSTEMD=1 makes this a failure")
    if min_version:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
        version = int(re.match(r"systemd (\d+)", out).group(1))  # type: ignore[union-attr]
        if version < min_version:
            message = f"systemd {version} has no `systemd-analyze security --offline` (needs {min_version})"
            if required:
                pytest.fail(message)
            pytest.skip(message)
    return path


def installed_unit(name: str, directory: Path, *, replace: tuple[str, str] | None = None) -> Path:
    """A copy of the unit whose ExecStart runs this environment's slurmtel entry points."""
    bin_dir = Path(sys.executable).parent
    for entry in ("slurmtel", "slurmtel-agent"):
        assert (bin_dir / entry).is_file(), (
            f"{bin_dir / entry} missing: install the package (pip install -e .)"
        )
    content = (UNITS / name).read_text().replace("/usr/local/bin/", f"{bin_dir}/")
    if replace:
        assert replace[0] in content
        content = content.replace(*replace)
    copy = directory / name
    copy.write_text(content)
    return copy


def directives(name: str) -> dict[str, list[str]]:
    """'Section.Key' -> values, in order (systemd allows a key several times)."""
    result: dict[str, list[str]] = {}
    section = ""
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        result.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return result


@pytest.mark.parametrize("name", [HEAD, AGENT, SERVE])
def test_systemd_analyze_verify_accepts_the_unit(name: str, tmp_path: Path) -> None:
    analyze = systemd_analyze()
    unit = installed_unit(name, tmp_path)
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if name in line]
    assert done.returncode == 0 and complaints == [], done.stdout + done.stderr


def test_systemd_analyze_verify_would_catch_a_typo(tmp_path: Path) -> None:
    analyze = systemd_analyze()
    unit = installed_unit(HEAD, tmp_path, replace=("ProtectSystem=strict", "ProtectSystm=strict"))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert "ProtectSystm" in done.stdout + done.stderr


@pytest.mark.parametrize("name", [HEAD, AGENT, SERVE])
def test_the_units_exposure_level_is_low(name: str, tmp_path: Path) -> None:
    analyze = systemd_analyze(min_version=250)
    unit = installed_unit(name, tmp_path)
    limit = EXPOSURE_LIMIT[name]
    done = subprocess.run(
        # --threshold counts tenths (the printed 1.4 is 14)
        [analyze, "security", "--offline=yes", f"--threshold={round(limit * 10)}", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    match = re.search(rf"Overall exposure level for {re.escape(name)}: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    print(f"{name}: exposure {match.group(1)} (limit {limit})")
    assert float(match.group(1)) <= limit
    assert done.returncode == 0, done.stdout + done.stderr


def test_both_units_are_notify_services_with_a_watchdog_and_no_privileges() -> None:
    for name in (HEAD, AGENT):
        d = directives(name)
        assert d["Service.Type"] == ["notify"] and d["Service.NotifyAccess"] == ["main"]
        assert d["Service.WatchdogSec"] and d["Service.User"] == ["slurmtel"]
        assert d["Service.StateDirectory"] == ["slurmtel"]
        assert d["Service.CapabilityBoundingSet"] == [""] and d["Service.AmbientCapabilities"] == [""]
        for key in (
            "NoNewPrivileges",
            "ProtectHome",
            "PrivateTmp",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectControlGroups",
            "RestrictNamespaces",
            "LockPersonality",
            "MemoryDenyWriteExecute",
        ):
            assert d[f"Service.{key}"] == ["yes"], (name, key)
        assert d["Service.ProtectSystem"] == ["strict"]
        assert d["Service.RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
        assert d["Service.SystemCallFilter"][0] == "@system-service"


def test_the_agent_sees_the_gpus_and_other_users_processes_the_head_does_not() -> None:
    head, agent = directives(HEAD), directives(AGENT)
    assert head["Service.PrivateDevices"] == ["yes"] and head["Service.ProtectProc"] == ["invisible"]
    # NVML needs /dev/nvidia*; job mapping needs other users' /proc/PID/cgroup
    assert "Service.PrivateDevices" not in agent and "Service.ProtectProc" not in agent
    assert agent["Service.DevicePolicy"] == ["closed"]
    assert agent["Service.DeviceAllow"] == ["char-nvidia-frontend rw", "char-nvidia rw", "char-nvidia-caps r"]
    assert "ExecStart=/usr/local/bin/slurmtel-agent" in (UNITS / AGENT).read_text()
    assert (
        "ExecStart=/usr/local/bin/slurmtel --config /etc/slurmtel/slurmtel.toml run"
        in (UNITS / HEAD).read_text()
    )


def test_the_epilog_hook_is_valid_bash() -> None:
    hook = UNITS / "slurmtel-epilog.sh"
    assert os.access(hook, os.X_OK)
    subprocess.run(["bash", "-n", str(hook)], check=True)


def test_the_read_api_is_hardened_like_the_daemon_and_reads_its_secrets_from_a_root_only_file() -> None:
    serve, head = directives(SERVE), directives(HEAD)
    assert serve["Service.ExecStart"][0].endswith(" serve") and serve["Service.User"] == ["slurmtel"]
    hardening = {k: v for k, v in head.items() if k.startswith("Service.") and k.split(".")[1] in HARDENING}
    assert hardening and all(serve.get(k) == v for k, v in hardening.items()), {
        k: (serve.get(k), v) for k, v in hardening.items() if serve.get(k) != v
    }
    assert serve["Service.EnvironmentFile"] == ["-/etc/slurmtel/serve.environment"]


HARDENING = (
    "NoNewPrivileges",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "SystemCallFilter",
    "SystemCallArchitectures",
)
