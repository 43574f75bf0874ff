"""The installed package has everything a checkout has (pyproject lists packages by hand,
because migrations/ ships inside the package as slurmtel.migrations)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "slurmtel").rglob("__init__.py")
    } | {"slurmtel.migrations", "slurmtel.migrations.versions"}
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "pyproject lists packages that do not exist"
    assert setuptools["package-dir"]["slurmtel.migrations"] == "migrations"


def test_package_data_covers_the_data_files() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*" in data["slurmtel"]
    assert {"script.py.mako", "versions/*.py"} <= set(data["slurmtel.migrations"])
    assert list((ROOT / "slurmtel" / "data").glob("*.json"))
