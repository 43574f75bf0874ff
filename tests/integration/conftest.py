"""The real Slurm the integration suite runs against: the lab in tests/slurm_lab.

The session fixture `slurm_lab` purges and starts the lab (down.sh --purge, up.sh), runs the job
mix (scenario.sh), makes slurmdbd roll up the open hour (force-rollup.sh) and hands the tests the
manifest, the window and helpers that run the Slurm clients.

Without root or Debian, or when up.sh fails (e.g. apt cannot install the packages), the tests
skip with the reason - or fail with it when SLURMTEL_REQUIRE_SLURM=1 (CI sets it).
SLURMTEL_SLURM_LAB_REUSE=1 reuses the previous run (its manifest under
/var/tmp/slurmtel-lab/last-run) when the cluster is still up: for iterating on the tests only.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

from tests.integration.lab import (
    ENV_REQUIRE,
    LOG_DIR,
    STATE_DIR,
    LabUnavailable,
    SlurmLab,
    bring_up_lab,
    check_prerequisites,
)

LAB_TIMINGS = pytest.StashKey[dict[str, float]]()


def lab_unavailable(reason: str) -> NoReturn:
    """Skip, or fail when Slurm is required (CI): the reason is the message either way."""
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{ENV_REQUIRE}=1 but there is no Slurm lab: {reason}", pytrace=False)
    pytest.skip(f"no Slurm lab: {reason}")


@pytest.fixture(scope="session")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    timings: dict[str, float] = {}
    request.config.stash[LAB_TIMINGS] = timings
    reason = ""
    try:
        check_prerequisites()
    except LabUnavailable as exc:
        reason = str(exc)
    if reason:
        lab_unavailable(reason)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    # one pytest session at a time drives the lab (a second one waits here)
    with (STATE_DIR / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lab: SlurmLab | None = None
        try:
            lab = bring_up_lab(timings)
        except LabUnavailable as exc:
            reason = str(exc)
        if lab is None:
            lab_unavailable(f"it did not come up: {reason}")
        yield lab


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    timings = config.stash.get(LAB_TIMINGS, None)
    if timings:
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        terminalreporter.write_line(f"slurm lab: {parts} (logs in {LOG_DIR})")
