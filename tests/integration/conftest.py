"""The real Slurms the integration suite runs against: the labs in tests/slurm_lab.

Every test that takes the session fixture `slurm_lab` runs once per lab: Slurm 22.05 (the
host's), 24.11 and 26.05 (Debian chroots, tests/slurm_lab/newer), ids `slurm-22.05` etc. Each
lab is purged and started (down.sh --purge, up.sh), runs the job mix (scenario.sh), has its
open hour rolled up (force-rollup.sh) and hands the tests its manifest, window and clients.

The labs come up in the background as soon as collection is done (LabRunner, all at once
unless SLURMTEL_SLURM_LAB_CONCURRENCY says otherwise) while the rest of the suite runs: the
real-Slurm tests are moved to the end of the session, grouped by lab.

Without root or Debian, or when a lab cannot come up (e.g. apt or debootstrap cannot reach the
mirror), its tests skip with the reason - or fail with it when SLURMTEL_REQUIRE_SLURM=1 (CI
sets it). SLURMTEL_SLURM_LAB_REUSE=1 reuses each lab's previous run (its manifest under
/var/tmp/slurmtel-lab/VERSION/last-run) when its cluster is still up: for iterating on the
tests only.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from slurmtel.config import Config
from tests.integration.lab import (
    ENV_REQUIRE,
    LABS,
    STATE_DIR,
    LabRunner,
    LabUnavailable,
    ScenarioFailed,
    SlurmLab,
    concurrency_from_env,
)

RUNNER = pytest.StashKey[LabRunner]()


def lab_unavailable(reason: str) -> NoReturn:
    """Skip, or fail when Slurm is required (CI): the reason is the message either way."""
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"{ENV_REQUIRE}=1 but there is no Slurm lab: {reason}", pytrace=False)
    pytest.skip(f"no Slurm lab: {reason}")


def lab_version(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("slurm_lab") if callspec is not None else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the labs come up while everything else runs: their tests last, still grouped by lab;
    # a module with RUNS_LAST (jobs of its own in the lab's accounting) after all of them
    def last(item: pytest.Item) -> bool:
        return bool(getattr(getattr(item, "module", None), "RUNS_LAST", False))

    items[:] = (
        [i for i in items if lab_version(i) is None]
        + [i for i in items if lab_version(i) is not None and not last(i)]
        + [i for i in items if lab_version(i) is not None and last(i)]
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    versions = sorted({v for item in session.items if (v := lab_version(item)) is not None})
    if versions and not session.config.option.collectonly:
        session.config.stash[RUNNER] = LabRunner(versions, concurrency_from_env())


def pytest_sessionfinish(session: pytest.Session) -> None:
    runner = session.config.stash.get(RUNNER, None)
    if runner is not None:
        runner.close()


@pytest.fixture(scope="session", params=list(LABS), ids=lambda version: f"slurm-{version}")
def slurm_lab(request: pytest.FixtureRequest) -> SlurmLab:
    version: str = request.param
    runner = request.config.stash.get(RUNNER, None)
    assert runner is not None, "the labs are started once collection is finished"
    try:
        lab = runner.get(version)
    except LabUnavailable as exc:
        lab_unavailable(f"Slurm {version} did not come up: {exc}")
    except ScenarioFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    # the lab runs the release it is named after (a moving Debian suite would show here)
    assert lab.slurm_version.split()[-1].startswith(f"{version}."), lab.slurm_version
    return lab


@pytest.fixture
def sacct_format() -> str:
    """How slurmtel reads sacct (sources.sacct.format): its default, "json"; the tests that
    check what slurmtel makes of sacct parametrise it over SACCT_FORMATS to read -P too."""
    return "json"


@pytest.fixture
def config(slurm_lab: SlurmLab, sacct_format: str) -> Config:
    """slurmtel's default config, with the Slurm clients of the lab under test."""
    return slurm_lab.config({"sources": {"sacct": {"format": sacct_format}}})


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    runner = config.stash.get(RUNNER, None)
    if runner is None:
        return
    for version, timings in runner.timings.items():
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        ready = runner.total_seconds.get(version)
        terminalreporter.write_line(
            f"slurm lab {version}: {parts}; ready {ready} s after collection"
            f" (logs in {STATE_DIR / version / 'logs'})"
        )
