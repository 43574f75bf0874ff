"""The README documents each report exactly as its spec declares it (slurmtel.reports.catalog):
every section name and every column of every section is named in the report's README section,
and every `report NAME` section of the README is a report that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.spec import ReportSpec

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
HEADING = re.compile(r"^### `report (\w+)`.*$", re.MULTILINE)


def readme_section(name: str) -> str:
    """The text under the README heading `### report NAME` (up to the next heading)."""
    for match in HEADING.finditer(README):
        if match.group(1) == name:
            rest = README[match.end() :]
            following = re.search(r"^#{1,3} ", rest, re.MULTILINE)
            return rest[: following.start()] if following else rest
    raise AssertionError(f"README has no section '### `report {name}`'")


def spec_columns(spec: ReportSpec) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for section in spec.sections:
        found[section.name] = {f for t in section.row_types() for f in t.__dataclass_fields__}
    return found


def named(text: str) -> set[str]:
    """Names in backticks, `a`/`b` alternatives split."""
    return {n for quoted in re.findall(r"`([^`]+)`", text) for n in re.split(r"[/, ]+", quoted) if n}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_the_readme_names_every_section_and_column_of_the_report(name: str) -> None:
    spec = REPORTS[name]
    text = named(readme_section(name))
    # the group columns every report has are said once, in "Output" and "report usage"
    general = {"cluster", "account", "user", "partition"}
    for section, columns in spec_columns(spec).items():
        if len(spec.sections) > 1:
            assert section in text, f"report {name}: section `{section}` is not in the README"
        missing = sorted(columns - text - general)
        assert not missing, f"report {name}, section {section}: README does not name {missing}"


def test_every_readme_report_section_is_a_report() -> None:
    documented = {m.group(1) for m in HEADING.finditer(README)}
    others = {"fabric", "budget", "cost"}  # reports of their own commands, not specs
    assert documented - others == set(REPORTS), documented ^ set(REPORTS)
