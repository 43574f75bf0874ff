"""docs/reports.md documents every report and view as the code declares it: each output's
column table (between `<!-- columns: NAME -->` markers) is what slurmtel.reports.docs generates
from the specs and the declared columns, every output has its table, and every section of every
report spec is named there; docs/columns.md is generated from slurmtel.columns (test_columns)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.docs import BLOCK, block, outputs, refresh

DOCS = Path(__file__).resolve().parents[1] / "docs"
REPORTS_MD = (DOCS / "reports.md").read_text()


def test_every_column_table_is_current() -> None:
    assert refresh(REPORTS_MD) == REPORTS_MD, "docs/reports.md is stale: python -m slurmtel.reports.docs"


@pytest.mark.parametrize("name", sorted(outputs()))
def test_every_output_has_its_table(name: str) -> None:
    assert block(name) in REPORTS_MD, f"docs/reports.md has no <!-- columns: {name} --> table"


def test_every_table_is_an_output() -> None:
    named = {m.group("name") for m in BLOCK.finditer(REPORTS_MD)}
    assert named == set(outputs())


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_every_report_has_a_heading_and_its_sections_are_named(name: str) -> None:
    heading = re.search(rf"^## `report {name}`$", REPORTS_MD, re.MULTILINE)
    assert heading, f"docs/reports.md has no heading for report {name}"
    spec = REPORTS[name]
    if len(spec.sections) > 1:
        text = REPORTS_MD[heading.end() :]
        for section in spec.sections:
            assert f"`{section.name}`" in text, f"report {name}: section {section.name} is not named"
