"""One vocabulary (DESIGN §4): every column any output emits is defined once in
slurmtel.columns, with its unit in its name, and outputs that name the same figure compute the
same number.

- the registry keeps its own rules (a kind's suffix; a name once);
- every output, run through the real CLI on tests.factories.admin_day in JSON and CSV (every
  report of the catalog, cost, budget, fabric, nodes --drift, job, me, me --jobs, runs,
  quarantine list), emits registered names only, and a value of the kind its column says;
- the API's OpenAPI schema takes each column's type from the registry;
- every Grafana panel's columns are registered ones or their table names (tests/test_grafana.py);
- docs/columns.md is what `python -m slurmtel.columns` prints;
- the same name, the same number: idle in report idle = the taxonomy's idle + no-process;
  capacity's useful GPU time per GPU-month = report cost's for the same window.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from slurmtel.access import EVERYTHING
from slurmtel.api.openapi import openapi_document
from slurmtel.cli import main
from slurmtel.columns import COLUMNS, Kind, _add, column, markdown, table_name, table_names
from slurmtel.config import Config
from slurmtel.reports.catalog import REPORTS
from slurmtel.store.reports_idle import idle_report
from slurmtel.store.reports_taxonomy import capacity_report, taxonomy_report
from tests.conftest import FIXED_NOW, fixture_path
from tests.factories import at, load_admin_day

ROOT = Path(__file__).resolve().parents[1]
DAY = ("-S", "2026-11-01", "-E", "2026-11-02")
COSTS = (
    '[cost]\ncompute_per_month = "2400"\nnetwork_per_month = "150"\nstorage_per_month = "300"\n'
    'support_per_month = "90"\noperations_per_month = "60"\nbaseline_price_per_gpu_hour = "2.50"\n'
    'target_gpu_hours_per_month = "1000"\n'
)
BUDGETS = (
    '[[chargeback.rates]]\nprice_per_gpu_hour = "2.00"\nvalid_from = "2026-01-01"\n'
    '[[chargeback.budgets]]\naccount = "physics"\nperiod = "month"\ngpu_hours = "100"\n'
    '[[chargeback.budgets]]\naccount = "chem"\nperiod = "month"\namount = "50"\n'
)
Run = Callable[..., str]


# ------------------------------------------------------------------------------ the registry


def test_a_kind_takes_its_suffix_and_a_name_is_defined_once() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        _add("idle_gpu_seconds", Kind.SECONDS, "again")
    with pytest.raises(ValueError, match="must end in _seconds"):
        _add("idle_gpu_hours_x", Kind.SECONDS, "hours are a table's unit")
    with pytest.raises(ValueError, match="ends in _share"):
        _add("x_share", Kind.INTEGER, "a share that is a count")
    with pytest.raises(ValueError, match="not registered"):
        column("idle_gpu_hours")
    for name, col in COLUMNS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert col.meaning and col.design.startswith("§"), name


def test_table_names_are_derived_and_never_a_registered_name() -> None:
    assert table_name("queue_wait_p50_seconds") == "queue_wait_p50_hours"
    assert table_name("useful_gpu_seconds_per_gpu_month") == "useful_gpu_hours_per_gpu_month"
    assert table_name("idle_share") == "idle_percent"
    assert table_name("mem_peak_bytes") == "mem_peak_gib"
    assert table_name("energy_joules") == "energy_kwh"
    assert table_name("jobs") == "jobs"
    clashes = set(table_names()) & set(COLUMNS)
    assert not clashes, f"a table name is also a registered column: {sorted(clashes)}"


def test_docs_columns_md_is_generated_from_the_registry() -> None:
    assert (ROOT / "docs" / "columns.md").read_text() == markdown(), (
        "docs/columns.md is stale: python -m slurmtel.columns > docs/columns.md"
    )


def test_every_report_spec_column_is_registered() -> None:
    for spec in REPORTS.values():
        for section in spec.sections:
            for row in section.row_types():
                for name in row.__dataclass_fields__:
                    column(name)


def test_a_row_shape_refuses_a_name_at_once_and_builds_its_type_once() -> None:
    """The catalog's row types are built when a report of them first runs (the CLI's start,
    issue 28), but a column that is not registered is still refused where it is declared."""
    from slurmtel.reports.spec import RowShape

    with pytest.raises(ValueError):
        RowShape("BadRow", ("cluster", "not_a_registered_column"))
    with pytest.raises(ValueError, match="named twice"):
        RowShape("TwiceRow", ("cluster", "cluster"))
    shape = RowShape("IdleRowProbe", ("cluster", "idle_gpu_seconds"))
    assert shape._type is None
    built = shape.type
    assert shape.type is built
    assert [f for f in built.__dataclass_fields__] == ["cluster", "idle_gpu_seconds"]
    assert built(cluster="a", idle_gpu_seconds=1.0).idle_gpu_seconds == 1.0


def test_the_openapi_schema_takes_each_column_from_the_registry() -> None:
    document = openapi_document()
    seen = 0
    for path, item in document["paths"].items():
        if not path.startswith("/v1/reports/"):
            continue
        response = item["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        sections = response["properties"]["sections"]
        for section in sections.get("prefixItems", [sections.get("items")]):
            rows = section["properties"]["rows"]["items"]
            for schema in rows.get("oneOf", [rows]):
                for name, prop in schema["properties"].items():
                    assert prop["description"].startswith(column(name).meaning), name
                    seen += 1
    assert seen > 100


# ------------------------------------------------------------------------------ every output


@pytest.fixture
def run(
    engine: Engine,
    config: Config,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Run:
    """The real CLI as root (an admin) on admin_day, with [cost], budgets and fabric runs."""
    load_admin_day(engine, config)
    from slurmtel.parsers.nccl import parse_nccl_tests
    from slurmtel.records import NcclRun
    from slurmtel.store.fabric import NcclLogWrite, write_nccl_log

    raw = fixture_path("nccl_tests", "cases", "cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook", "input.txt")
    with engine.begin() as conn:
        write_nccl_log(
            conn,
            NcclLogWrite(
                log_sha256="columns",
                origin="columns",
                bytes=1,
                runs=[r for r in parse_nccl_tests(raw.read_bytes()) if isinstance(r, NcclRun)],
                job=None,
                label="",
                run_at=at("2026-11-01T12:00:00"),
            ),
        )
    config_file = tmp_path / "slurmtel.toml"
    config_file.write_text('[site]\ntimezone = "UTC"\n' + COSTS + BUDGETS)
    monkeypatch.setenv("SLURMTEL_DATABASE_URL", database_url)
    monkeypatch.setattr("slurmtel.commands.common.utc_now", lambda: FIXED_NOW)

    def _run(*argv: str) -> str:
        capsys.readouterr()
        code = main(["--config", str(config_file), "--log-level", "ERROR", *argv])
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
        return out

    return _run


OUTPUTS: list[tuple[str, ...]] = [
    *(("report", name, *DAY) for name in sorted(REPORTS)),
    ("report", "usage", *DAY, "--by", "user"),
    ("report", "usage", *DAY, "--by", "partition"),
    ("report", "cost", *DAY),
    ("report", "cost", *DAY, "--by", "account"),
    ("report", "budget", "--at", "2026-11-20"),
    ("report", "fabric", *DAY),
    ("report", "fabric", *DAY, "--nodes"),
    ("report", "nodes", "--drift"),
    ("job", "101"),
    ("me", "-u", "alice", "--month", "2026-11"),
    ("me", "-u", "alice", "--month", "2026-11", "--jobs"),
    ("runs",),
    ("quarantine", "list"),
    ("report", "usage", *DAY, "--tres", "all"),
    ("chargeback", "--month", "2026-11"),
    ("chargeback", "--month", "2026-11", "--totals"),
    ("chargeback", "--month", "2026-11", "--by", "account"),
    ("chargeback", "--month", "2026-11", "--completed-jobs"),
    ("chargeback", "--list"),
    ("chargeback", "--audit"),
]


def scalar_fields(document: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of every field of DOCUMENT holding a value (containers of rows are walked
    through: their names are sections, not columns)."""
    if isinstance(document, list):
        for item in document:
            yield from scalar_fields(item)
    elif isinstance(document, dict):
        for name, value in document.items():
            if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
                yield from scalar_fields(value)
            elif (
                isinstance(value, list)
                and not value
                and (name not in COLUMNS or column(name).kind is not Kind.TEXTS)
            ):
                continue  # an empty section
            else:
                yield name, value


def check_value(name: str, value: Any) -> None:
    kind = column(name).kind
    if value is None or value == "":
        return
    if kind is Kind.INTEGER:
        assert isinstance(value, int) and not isinstance(value, bool), (name, value)
    elif kind is Kind.FLAG:
        assert isinstance(value, bool), (name, value)
    elif kind is Kind.INSTANT:
        assert datetime.fromisoformat(value).utcoffset() is not None, (name, value)
    elif kind is Kind.DAY:
        date.fromisoformat(value)
    elif kind in (Kind.SECONDS, Kind.BYTES, Kind.JOULES, Kind.WATTS, Kind.SHARE, Kind.RATIO, Kind.QUANTITY):
        number = Decimal(str(value))
        if kind is Kind.SHARE:
            assert 0 <= number <= 1, (name, value)
    elif kind is Kind.MONEY:
        Decimal(str(value))
    elif kind is Kind.TEXTS:
        assert isinstance(value, list | str), (name, value)
    else:
        assert isinstance(value, str), (name, value)


@pytest.mark.parametrize(
    "argv", OUTPUTS, ids=lambda argv: " ".join(a for a in argv if not a.startswith("2026"))
)
def test_every_output_emits_registered_columns_of_their_kind(run: Run, argv: tuple[str, ...]) -> None:
    document = json.loads(run(*argv, "--format", "json"))
    fields = list(scalar_fields(document))
    # admin_day has no collect runs, quarantined records, port counters or closed statements
    empty = argv[0] in ("runs", "quarantine") or "--nodes" in argv or argv[-1] in ("--list", "--audit")
    assert fields or empty, f"{argv}: nothing to check"
    # document-level fields of job/me that are not columns: none
    for name, value in fields:
        check_value(name, value)
    if argv[0] == "job" or (argv[0] == "me" and "--jobs" not in argv):
        return  # a job and a month's summary have no CSV
    text = run(*argv, "--format", "csv")
    for line in csv.reader(io.StringIO(text)):
        if not line or line[0].startswith("# "):
            continue
        header = line
        for name in header:
            column(name)
        break


def test_tables_show_every_figure_in_its_table_unit(run: Run) -> None:
    """A table converts, in one place: no registered seconds, bytes or share name reaches a
    table header of the reports."""
    for argv in OUTPUTS:
        text = run(*argv, "--format", "table", "--wide")
        for name, col in COLUMNS.items():
            if col.kind in (Kind.SECONDS, Kind.BYTES, Kind.JOULES, Kind.SHARE, Kind.RATIO):
                assert not re.search(rf"(?<![a-z_]){name}(?![a-z_])", text), (argv, name)


# ------------------------------------------------------------------------------ same name, same number


def test_idle_is_the_taxonomys_idle_and_no_process_over_the_same_days(engine: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    day = date(2026, 11, 1)
    with engine.connect() as conn:
        idle = idle_report(conn, first_day=day, last_day=day, scope=EVERYTHING)
        taxonomy = taxonomy_report(
            conn, first_day=day, last_day=day, now=FIXED_NOW, timezone="UTC", scope=EVERYTHING
        )
        capacity = capacity_report(
            conn, first_day=day, last_day=day, now=FIXED_NOW, timezone="UTC", scope=EVERYTHING
        )
    (partition,) = idle["by_partition"]
    idle_seconds = sum(
        r["allocated_idle_gpu_seconds"] + r["allocated_no_process_gpu_seconds"] for r in taxonomy
    )
    no_process = sum(r["allocated_no_process_gpu_seconds"] for r in taxonomy)
    assert partition["idle_gpu_seconds"] == idle_seconds
    assert partition["no_process_gpu_seconds"] == no_process
    breakdown = {r["category"]: r["category_gpu_seconds"] for r in capacity["breakdown"]}
    assert breakdown["allocated_idle"] + breakdown["allocated_no_process"] == idle_seconds
    assert breakdown["unmeasured"] == sum(r["unmeasured_gpu_seconds"] for r in taxonomy)


def test_useful_work_per_gpu_month_is_one_definition(run: Run) -> None:
    capacity = json.loads(run("report", "capacity", *DAY, "--target-gpu-hours", "1000", "--format", "json"))[
        "summary"
    ][0]
    cost = json.loads(run("report", "cost", *DAY, "--format", "json"))[0]
    assert capacity["useful_gpu_seconds_per_gpu_month"] == cost["useful_gpu_seconds_per_gpu_month"]
    assert capacity["required_gpus"] == cost["required_gpus"]
    # and the unused GPU time cost shows is the taxonomy's unallocated + idle + no-process
    breakdown = {
        r["category"]: Decimal(str(r["category_gpu_seconds"]))
        for r in json.loads(run("report", "capacity", *DAY, "--format", "json"))["breakdown"]
    }
    unused = breakdown["unallocated"] + breakdown["allocated_idle"] + breakdown["allocated_no_process"]
    assert Decimal(str(cost["unused_gpu_seconds"])) == unused
