"""The column tables of docs/reports.md, generated from the code: every output's sections and
their columns (the report specs, and the declared columns of the outputs that are not specs),
each column's unit and meaning from slurmtel.columns.

docs/reports.md holds the prose; each output's table sits between `<!-- columns: NAME -->` and
`<!-- /columns -->` and is rewritten by `python -m slurmtel.reports.docs` (which also writes
docs/columns.md). tests/test_docs_reports.py fails when a table is stale or missing.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmtel.columns import COLUMNS, markdown, table_name, unit_text

# the CLI's spelling of the views whose API name differs
VIEW_TITLES = {
    "fabric_nodes": "report fabric --nodes",
    "nodes_drift": "report nodes --drift",
    "idle_now": "report idle-now",
}
BLOCK = re.compile(r"<!-- columns: (?P<name>[^>]+?) -->\n.*?<!-- /columns -->", re.DOTALL)


def outputs() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Output name (as the docs name it) -> its sections, each (section, columns)."""
    from slurmtel import chargeback
    from slurmtel.commands import finance, operations
    from slurmtel.commands.view_catalog import VIEWS
    from slurmtel.reports import researcher
    from slurmtel.reports.catalog import REPORTS
    from slurmtel.reports.spec import RowsBy

    found: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for spec in REPORTS.values():
        sections: list[tuple[str, tuple[str, ...]]] = []
        for section in spec.sections:
            name = section.name if spec.single is False else ""
            rows = section.row_types()
            if isinstance(section.row, RowsBy):
                # one row type per value of an option (usage --by): the first stands for all,
                # its group column taking the option's value
                name = f"--by {' | '.join(section.row.types)} (the group column as --by says)"
                rows = rows[:1]
            for row in rows:
                sections.append((name, tuple(f.name for f in dataclasses.fields(row))))
        found[f"report {spec.name}"] = sections
    for view in VIEWS.values():
        single = len(view.sections) == 1
        found[VIEW_TITLES.get(view.name, f"report {view.name}")] = [
            ("" if single else label, columns) for label, columns in view.sections
        ]
    found["job"] = [
        ("an attempt", researcher.JOB_COLUMNS),
        ("gpu_figures", researcher.GPU_COLUMNS),
        ("advice", ("advice",)),
    ]
    found["me"] = [
        ("", ("user", "month", *researcher.ME_SUMMARY_COLUMNS)),
        ("top_jobs", researcher.TOP_COLUMNS),
    ]
    found["me --jobs"] = [("", researcher.ME_JOBS_COLUMNS)]
    found["chargeback"] = [
        ("the statement's lines", chargeback.LINE_COLUMNS),
        ("--totals", chargeback.TOTALS_COLUMNS),
        ("--by", chargeback.ROLLUP_COLUMNS),
        ("--completed-jobs", chargeback.COMPLETED_COLUMNS),
        ("--diff", chargeback.DIFF_COLUMNS),
        ("--list", finance.LISTING_COLUMNS),
        ("--audit", finance.AUDIT_COLUMNS),
    ]
    found["runs"] = [("", operations.RUNS_COLUMNS)]
    found["quarantine list"] = [("", operations.QUARANTINE_COLUMNS)]
    return found


def table(sections: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    """Sections with the same columns share one table; each column once, in order."""
    groups: list[tuple[list[str], tuple[str, ...]]] = []
    for name, columns in sections:
        for names, shared in groups:
            if shared == columns:
                names.append(name)
                break
        else:
            groups.append(([name], columns))
    lines: list[str] = []
    for names, columns in groups:
        labelled = [n for n in names if n]
        if labelled:
            label = ", ".join(f"`{n}`" if re.fullmatch(r"\w+", n) else n for n in labelled)
            lines.append(("Sections " if len(labelled) > 1 else "") + label + ":")
            lines.append("")
        lines.append("| column | unit | table | meaning |")
        lines.append("|---|---|---|---|")
        for c in columns:
            col = COLUMNS[c]
            shown = table_name(c)
            lines.append(
                f"| `{c}` | {unit_text(col) or col.kind.value} | {'`' + shown + '`' if shown != c else ''} | "
                f"{col.meaning} |"
            )
        lines.append("")
    return "\n".join(lines)


def block(name: str) -> str:
    return f"<!-- columns: {name} -->\n{table(outputs()[name])}<!-- /columns -->"


def refresh(text: str) -> str:
    """TEXT with every column block rewritten from the code."""
    return BLOCK.sub(lambda m: block(m.group("name")), text)


def main() -> None:
    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs")
    reports = docs / "reports.md"
    reports.write_text(refresh(reports.read_text()))
    (docs / "columns.md").write_text(markdown())


if __name__ == "__main__":
    main()
