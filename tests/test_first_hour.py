"""The first hour after `slurmtel demo` (issue 22 item 4): the config `slurmtel` reads when given
none, and the README's next commands run as written on the demo's data.

The lookup (slurmtel.config.implicit_demo_config) is tested on files in a temporary state
directory; the end-to-end test runs the demo and the README's commands as a new user would: a
fresh HOME, the installed `slurmtel` script on PATH (an activated venv), subprocesses.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from slurmtel.cli import build_parser, main
from slurmtel.config import Config, demo_config_path, implicit_demo_config, load_config, user_state_dir

ROOT = Path(__file__).resolve().parent.parent
DEMO_CONFIG = """\
[site]
cluster = "demo"
state_dir = "{state_dir}"
clock = "2026-12-04T00:00:00Z"
"""


@pytest.fixture
def fresh_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user with their own state directory, no config anywhere, and a demo's config in it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for name in ("SLURMTEL_CONFIG", "SLURMTEL_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("slurmtel.config.DEFAULT_CONFIG_PATH", tmp_path / "etc" / "slurmtel.toml")
    path = demo_config_path()
    path.parent.mkdir(parents=True)
    path.write_text(DEMO_CONFIG.format(state_dir=path.parent))
    return path


def test_the_demo_config_is_read_when_no_other_is_there(fresh_state: Path) -> None:
    assert demo_config_path() == user_state_dir() / "demo" / "slurmtel.toml"
    assert implicit_demo_config() == fresh_state


def test_a_real_config_always_wins(
    fresh_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc" / "slurmtel.toml"
    etc.parent.mkdir()
    etc.write_text('[site]\ncluster = "prod"\n')
    assert implicit_demo_config() is None
    # present but unreadable is still there: its error is the answer, never the demo's world
    etc.chmod(0)
    assert implicit_demo_config() is None
    etc.unlink()
    monkeypatch.setenv("SLURMTEL_CONFIG", str(tmp_path / "mine.toml"))
    assert implicit_demo_config() is None


def test_a_database_url_in_the_environment_never_meets_the_demo_config(
    fresh_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", "postgresql://slurmtel@db.example.org/slurmtel")
    assert implicit_demo_config() is None
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", "  ")
    assert implicit_demo_config() == fresh_state


def test_the_system_state_directory_is_never_looked_in(
    fresh_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head whose state is /var/lib/slurmtel (built-in defaults, no config file) keeps its
    own database after someone ran the demo there."""
    monkeypatch.setattr(Config, "state_dir", lambda self: Path("/var/lib/slurmtel"))
    assert implicit_demo_config() is None


def test_nothing_found_without_a_demo(fresh_state: Path) -> None:
    fresh_state.unlink()
    assert implicit_demo_config() is None


def test_the_agent_and_the_demo_never_read_it(fresh_state: Path) -> None:
    # load_config (the agent's) knows nothing of the demo: defaults
    assert load_config().path is None
    # `slurmtel demo` reads no config it left itself (its home would be <state_dir>/demo/demo)
    assert build_parser("demo").parse_args(["demo"]).finds_demo_config is False
    assert build_parser("report").parse_args(["report", "usage"]).finds_demo_config is True


def test_the_cli_reads_it_and_says_so(fresh_state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config"]) == 0
    captured = capsys.readouterr()
    assert f"# slurmtel {__import__('slurmtel').__version__}: {fresh_state} is valid" in captured.out
    assert 'clock = "2026-12-04T00:00:00Z"' in captured.out
    assert captured.err == (
        f"slurmtel: note: using the demo's config {fresh_state} (no --config, $SLURMTEL_CONFIG or "
        f"{__import__('slurmtel.config').config.DEFAULT_CONFIG_PATH})\n"
    )
    # an explicit --config is read, and nothing is said
    other = fresh_state.parent / "other.toml"
    other.write_text('[site]\ncluster = "other"\n')
    assert main(["--config", str(other), "check-config"]) == 0
    captured = capsys.readouterr()
    assert f"{other} is valid" in captured.out and captured.err == ""


# ------------------------------------------------------------------------- end to end


def readme_next_commands() -> list[str]:
    """The commands the README's "Two commands" section gives for after the demo."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Two commands") : readme.index("## Install on a cluster")]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    after = next(b for b in blocks if "slurmtel report" in b)
    return [line.split("#")[0].strip() for line in after.splitlines() if line.split("#")[0].strip()]


def test_the_readme_says_to_activate_the_venv() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Two commands") : readme.index("## Install on a cluster")]
    first = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0].strip()
    assert first == "python3 -m venv .venv && . .venv/bin/activate && pip install '.[head]' && slurmtel demo"
    commands = readme_next_commands()
    assert commands and all(c.startswith("slurmtel ") for c in commands)


@pytest.mark.timeout(900)
def test_after_the_demo_the_readme_commands_work_as_written() -> None:
    """A new user: a fresh HOME, the venv's bin first on PATH (activated), `slurmtel demo`,
    then each command the README gives and each the demo's last lines give, as written."""
    assert not Path("/etc/slurmtel/slurmtel.toml").exists(), (
        "this machine has /etc/slurmtel/slurmtel.toml: it wins over the demo's config, as it should"
    )
    # not under pytest's basetemp: other pytest sessions on this machine remove old ones, and
    # this test runs for minutes
    with tempfile.TemporaryDirectory(prefix="slurmtel-first-hour-") as tmp:
        run_the_first_hour(Path(tmp) / "home")


def run_the_first_hour(home: Path) -> None:
    home.mkdir()
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "slurmtel").is_file(), "the slurmtel script is installed beside this python"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURMTEL_") and k not in ("XDG_STATE_HOME", "VIRTUAL_ENV")
    }
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200")

    def slurmtel(command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            shlex.split(command), cwd=home, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    demo = slurmtel("slurmtel demo", timeout=800)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr
    assert "(exit status" not in demo.stdout, demo.stdout
    lines = demo.stdout.splitlines()
    took = next(line for line in lines if line.startswith("demo took "))
    assert re.fullmatch(r"demo took \d+\.\d s\. Everything it wrote is under .*", took)
    assert f"{home}/.local/state/slurmtel/demo" in took
    printed = lines[lines.index(next(line for line in lines if line.startswith("Next, try these"))) + 1 :]
    printed = [line.strip() for line in printed if line.startswith("  slurmtel ")]
    assert printed, demo.stdout[-2000:]
    pages_start = next(line for line in lines if line.startswith("  start: "))
    pages_open = next(line for line in lines if line.startswith("  open: "))
    demo_config = home / ".local/state/slurmtel/demo/slurmtel.toml"
    note = f"slurmtel: note: using the demo's config {demo_config}"
    for command in dict.fromkeys([*readme_next_commands(), *printed]):
        result = slurmtel(command)
        assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}{result.stderr}"
        errors = [line for line in result.stderr.splitlines() if not line.startswith(note)]
        if "--plot" in command:
            assert errors == [f"slurmtel: wrote {shlex.split(command)[-1]}"], result.stderr
            assert (home / shlex.split(command)[-1]).read_bytes()[:4] == b"\x89PNG"
        else:
            assert errors == [], f"{command}: {result.stderr}"
        assert note in result.stderr
        assert result.stdout.strip(), f"{command} printed nothing"
        assert "(no rows)" not in result.stdout.split("\n\n")[0], f"{command}:\n{result.stdout}"
    # the pages, as the demo says to open them: the server it names, each URL it names
    server = subprocess.Popen(
        shlex.split(pages_start.removeprefix("  start: ")),
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        urls = pages_open.removeprefix("  open: ").split()
        for _ in range(300):
            try:
                with urllib.request.urlopen(urls[0].split("/jobs/")[0] + "/healthz", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                time.sleep(0.2)
        for url in urls:
            with urllib.request.urlopen(url, timeout=60) as response:
                page = response.read().decode()
            assert response.status == 200 and "root (admin)" in page, url
    finally:
        server.terminate()
        server.wait(timeout=30)
