"""Every Grafana dashboard under config/grafana/ (DESIGN §7: every panel's SQL is executed).

Each dashboard JSON found there is checked, whoever adds it: its data sources follow the
import convention (a `${DS_...}` uid declared in `__inputs`), and the SQL of every target of
every panel (panels nested in rows included) runs against the test database after Grafana's
macros and the dashboard's variables are replaced by what Grafana would send for a fixed
window. Every query runs as Grafana's role (`slurmtel db roles --aggregate`, a member of
slurmtel_aggregate): it may read only the views of schema slurmtel_agg, so a panel that reads a
table fails with a permission error. The data is tests.factories.admin_day; the admin
dashboard's key panels must show the figures the CLI reports show, and every column a panel
returns is a registered one (slurmtel.columns) or its table name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine

from slurmtel.access import EVERYTHING
from slurmtel.columns import COLUMNS, table_names
from slurmtel.config import Config
from slurmtel.store.reports_taxonomy import taxonomy_report
from tests.conftest import LoginRoles
from tests.factories import load_admin_day

GRAFANA = Path(__file__).resolve().parent.parent / "config" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("**/*.json"))
FROM, TO = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)
DAY_EPOCH = int(FROM.timestamp())
POSTGRES = "grafana-postgresql-datasource"
# the columns Grafana itself reads: a series' time, its name and a figure/value pair
GRAFANA_NAMES = {"time", "metric", "value"}


@pytest.fixture(scope="module")
def grafana(login_roles: LoginRoles) -> Iterator[Engine]:
    """The test database as Grafana's login role."""
    engine = create_engine(login_roles.url(login_roles.aggregate))
    yield engine
    engine.dispose()


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield panel, target


# ---------------------------------------------------------------- Grafana's macros


def _iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(interval: str) -> int:
    match = re.fullmatch(r"'?\s*(\d+)\s*(ms|s|m|h|d|w)\s*'?", interval.strip())
    assert match, f"unsupported interval {interval!r}"
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return max(1, int(int(match.group(1)) * units[match.group(2)]))


def _closing(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at OPEN_AT (quotes respected)."""
    depth, quote = 0, ""
    for i in range(open_at, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(f"unbalanced macro call in {text[open_at : open_at + 80]!r}")


def _split_args(text: str) -> list[str]:
    args, depth, quote, current = [], 0, "", ""
    for c in text:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        current += c
    if current.strip():
        args.append(current.strip())
    return args


def _macro(name: str, args: list[str] | None, start: datetime, end: datetime) -> str:
    a = args or []
    if name == "timeFilter":
        return f"{a[0]} BETWEEN '{_iso(start)}' AND '{_iso(end)}'"
    if name == "timeFrom":
        return f"'{_iso(start)}'"
    if name == "timeTo":
        return f"'{_iso(end)}'"
    if name in ("timeGroup", "timeGroupAlias"):
        s = _seconds(a[1])
        alias = ' AS "time"' if name.endswith("Alias") else ""
        return f"floor(extract(epoch from {a[0]})/{s})*{s}{alias}"
    if name == "time":
        return f'{a[0]} AS "time"'
    if name == "timeEpoch":
        return f'extract(epoch from {a[0]}) AS "time"'
    if name == "unixEpochFilter":
        return f"{a[0]} >= {int(start.timestamp())} AND {a[0]} <= {int(end.timestamp())}"
    if name == "unixEpochNanoFilter":
        return f"{a[0]} >= {int(start.timestamp()) * 10**9} AND {a[0]} <= {int(end.timestamp()) * 10**9}"
    if name == "unixEpochFrom":
        return str(int(start.timestamp()))
    if name == "unixEpochTo":
        return str(int(end.timestamp()))
    if name in ("unixEpochGroup", "unixEpochGroupAlias"):
        s = _seconds(a[1])
        alias = ' AS "time"' if name.endswith("Alias") else ""
        return f"floor({a[0]}/{s})*{s}{alias}"
    if name == "interval":
        return "1h"
    if name == "interval_ms":
        return "3600000"
    raise AssertionError(f"macro $__{name} is not one Grafana's PostgreSQL data source knows")


def expand_macros(sql: str, start: datetime = FROM, end: datetime = TO) -> str:
    out, i = [], 0
    for match in re.finditer(r"\$__(\w+)", sql):
        if match.start() < i:
            continue
        out.append(sql[i : match.start()])
        j, args = match.end(), None
        if j < len(sql) and sql[j] == "(":
            close = _closing(sql, j)
            args, j = _split_args(sql[j + 1 : close]), close + 1
        out.append(_macro(match.group(1), args, start, end))
        i = j
    out.append(sql[i:])
    return "".join(out)


def variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """name -> the value Grafana substitutes (current value, else a constant's query)."""
    values = {}
    for var in dashboard.get("templating", {}).get("list", []):
        current = (var.get("current") or {}).get("value")
        if current is None and var.get("type") in ("constant", "textbox"):
            current = var.get("query")
        if current is None and var.get("options"):
            current = var["options"][0]["value"]
        assert current is not None, f"variable {var.get('name')} has no value to test with"
        if isinstance(current, list):
            current = ",".join(f"'{v}'" for v in current)
        values[var["name"]] = str(current)
    return values


def expand(sql: str, dashboard: dict[str, Any]) -> str:
    sql = expand_macros(sql)
    for name, value in variables(dashboard).items():
        sql = re.sub(r"\$\{" + re.escape(name) + r"(:[^}]*)?\}", value, sql)
        sql = sql.replace(f"[[{name}]]", value)
        sql = re.sub(r"\$" + re.escape(name) + r"(?!\w)", value, sql)
    assert not re.search(r"\$\{?\w", sql), f"unexpanded variable in:\n{sql}"
    return sql


def test_macro_expansion() -> None:
    sql = "SELECT $__timeGroupAlias(CAST(day AS timestamptz), '1d'), x FROM t WHERE $__timeFilter(f(a, b)) AND $__unixEpochFilter(e)"
    assert expand_macros(sql) == (
        'SELECT floor(extract(epoch from CAST(day AS timestamptz))/86400)*86400 AS "time", x FROM t '
        "WHERE f(a, b) BETWEEN '2026-11-01T00:00:00Z' AND '2026-11-02T00:00:00Z' "
        f"AND e >= {DAY_EPOCH} AND e <= {DAY_EPOCH + 86400}"
    )
    assert expand(
        "SELECT '$tz', ${tz}, [[tz]]",
        {"templating": {"list": [{"name": "tz", "type": "constant", "query": "UTC"}]}},
    ) == ("SELECT 'UTC', UTC, UTC")


# ---------------------------------------------------------------- every dashboard, every panel


def test_dashboards_exist() -> None:
    assert GRAFANA.joinpath("slurmtel-admin.json") in DASHBOARDS


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_datasources_follow_the_import_convention(path: Path) -> None:
    dashboard = load(path)
    inputs = {i["name"]: i for i in dashboard.get("__inputs", [])}
    found = 0
    for panel in walk_panels(dashboard.get("panels", [])):
        sources = [panel.get("datasource")] if panel.get("type") != "row" else []
        sources += [t.get("datasource") for t in panel.get("targets", [])]
        for source in sources:
            uid = source.get("uid") if isinstance(source, dict) else source
            match = re.fullmatch(r"\$\{(DS_\w+)\}", str(uid))
            assert match, f"{path.name}: panel {panel.get('title')!r}: data source {source!r} is not an input"
            assert inputs[match.group(1)]["pluginId"] == POSTGRES
            if isinstance(source, dict):
                assert source["type"] == POSTGRES
            found += 1
    assert found


QUERIES = [
    pytest.param(path, panel["title"], target["refId"], id=f"{path.name}:{panel['title']}:{target['refId']}")
    for path in DASHBOARDS
    for panel, target in targets(load(path))
    if target.get("rawSql")
]


@pytest.mark.parametrize(("path", "title", "ref"), QUERIES)
def test_every_panel_query_runs(
    engine: Engine, grafana: Engine, config: Config, path: Path, title: str, ref: str
) -> None:
    load_admin_day(engine, config)
    dashboard = load(path)
    (target,) = [t for p, t in targets(dashboard) if p["title"] == title and t["refId"] == ref]
    columns, _ = run(grafana, expand(target["rawSql"], dashboard))
    if target.get("format") == "time_series":
        assert "time" in columns, f"a time series needs a 'time' column, got {columns}"
    # one vocabulary: a panel's columns are registered (or their table names, or Grafana's own)
    unknown = [c for c in columns if c not in COLUMNS and c not in table_names() and c not in GRAFANA_NAMES]
    assert not unknown, f"{title}: columns not in slurmtel.columns: {unknown}"


def run(engine: Engine, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run SQL as Grafana does: text without bind parameters (so LIKE 'x%' stays as it is)."""
    with engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute(sql)
        columns = [str(c[0]) for c in cursor.description or ()]
        rows = [tuple(r) for r in cursor.fetchall()]
        conn.rollback()
    return columns, rows


def panel_rows(engine: Engine, title: str) -> list[tuple[Any, ...]]:
    dashboard = load(GRAFANA / "slurmtel-admin.json")
    (target,) = [t for p, t in targets(dashboard) if p["title"] == title]
    return run(engine, expand(target["rawSql"], dashboard))[1]


def numbers(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(round(float(v), 4) if isinstance(v, float | Decimal) else v for v in r) for r in rows]


# ---------------------------------------------------------------- the admin dashboard's figures


def test_failure_panels(engine: Engine, grafana: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert numbers(panel_rows(grafana, "Failed GPU-hours by account")) == [
        (DAY_EPOCH, "bio", 2.0),
        (DAY_EPOCH, "chem", 8.0),
        (DAY_EPOCH, "physics", 10.0),
    ]
    assert numbers(panel_rows(grafana, "Top failing nodes")) == [
        ("gpu04", 1, 1, 10.0, 0),
        ("gpu02", 2, 1, 6.0, 0),
        ("gpu01", 1, 0, 4.0, 3),
    ]


def test_idle_panels(engine: Engine, grafana: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert numbers(panel_rows(grafana, "Idle GPU-hours by account")) == [
        (DAY_EPOCH, "bio", 0.0),
        (DAY_EPOCH, "chem", 0.0),
        (DAY_EPOCH, "physics", 1.0),
    ]
    assert numbers(panel_rows(grafana, "Idle share by account")) == [
        ("physics", 0.4, 0.2, 1.0),
        ("bio", None, 0.0, 0.0),
        ("chem", None, 0.0, 0.0),
    ]


def test_queue_panels(engine: Engine, grafana: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    assert numbers(panel_rows(grafana, "Queue wait p50 / p95 by partition")) == [
        (DAY_EPOCH, "gpu", 3600.0, 6099.0)
    ]
    assert numbers(panel_rows(grafana, "Pending now by reason")) == [
        ("Resources", "gpu", False, 2, 10, 3540.0),
        ("AssocGrpGRES", "gpu", True, 1, 4, 14340.0),
        ("QOSMaxGRESPerUser", "gpu", True, 1, 2, 7140.0),
        ("Priority", "debug", False, 1, 1, 1740.0),
    ]


def test_taxonomy_panel_agrees_with_the_report(engine: Engine, grafana: Engine, config: Config) -> None:
    load_admin_day(engine, config)
    panel = {
        metric.split(" ", 1)[1]: round(float(value), 4)
        for _, metric, value in panel_rows(grafana, "GPU-hour taxonomy per day")
    }
    assert panel == {
        "unavailable": 66.0,
        "unallocated": 82.5,
        "allocated_no_process": 0.5,
        "allocated_idle": 0.5,
        "unmeasured": 18.0,
        "active": 1.5,
    }
    with engine.connect() as conn:
        rows = taxonomy_report(
            conn,
            first_day=date(2026, 11, 1),
            last_day=date(2026, 11, 1),
            now=TO,
            timezone="UTC",
            scope=EVERYTHING,
        )
    assert panel == {c: float(sum(r[f"{c}_gpu_seconds"] for r in rows)) / 3600 for c in panel}
