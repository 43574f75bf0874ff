"""A report is a spec: a name, its parameters, one frozen query object in, frozen typed rows out.

The CLI (`slurmtel report NAME`, slurmtel.commands.reports) and the API (`slurmtel serve`) both
take a spec from slurmtel.reports.catalog.REPORTS, build its ReportQuery for the caller and call
`run_report`; neither has code of its own per report. A spec's SQL lives in one store module
(slurmtel/store/reports_*.py); the spec only names the function that runs it.

Row types are frozen dataclasses whose fields are registered columns (slurmtel.columns: each
name defined once, with its kind and unit); `row_type` refuses a name that is not registered.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from slurmtel.access import Action, Identity, Scope, allowed
from slurmtel.bounds import MAX_COUNT, check_count, check_name, check_number, parse_count, shown
from slurmtel.columns import json_schema, python_type
from slurmtel.errors import AccessDenied, ConfigError
from slurmtel.filters import JobFilter

if TYPE_CHECKING:
    from slurmtel.store.sql import Connection

# --- typed rows -------------------------------------------------------------------------------


def field_type(name: str) -> Any:
    """The type a column holds, from its registered kind (slurmtel.columns); ValueError for a
    name that is not registered."""
    return python_type(name)


def row_type(name: str, columns: Sequence[str]) -> type:
    """A frozen dataclass NAME with one field per column, typed from the column's name."""
    if len(set(columns)) != len(columns):
        raise ValueError(f"{name}: a column is named twice")
    cls = dataclasses.make_dataclass(name, [(c, field_type(c)) for c in columns], frozen=True, slots=True)
    cls.__module__ = __name__
    return cls


class RowShape:
    """A section's row type by name and columns, the columns checked when it is declared (a name
    not registered is refused at once), the type (row_type) built the first time a report of it
    runs: the CLI registers every report's options without building the catalog's row types,
    some 30 frozen dataclasses (issue 28)."""

    __slots__ = ("_type", "columns", "name")

    def __init__(self, name: str, columns: Sequence[str]) -> None:
        if len(set(columns)) != len(columns):
            raise ValueError(f"{name}: a column is named twice")
        for column in columns:
            field_type(column)
        self.name = name
        self.columns = tuple(columns)
        self._type: type | None = None

    @property
    def type(self) -> type:
        with _BUILDING:
            if self._type is None:
                self._type = row_type(self.name, self.columns)
            return self._type

    def __repr__(self) -> str:
        return f"RowShape({self.name!r}, {self.columns!r})"


# one row type per shape, however many threads of `slurmtel serve` run its first report at once
_BUILDING = threading.Lock()


def as_mapping(row: Any) -> dict[str, Any]:
    """A typed row as the renderer's column -> value mapping (shallow: values stay as they are)."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


def json_type(name: str) -> dict[str, Any]:
    """The OpenAPI/JSON-schema type of column NAME."""
    return json_schema(name)


# --- the query --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportQuery:
    """Everything a report's run needs, decided before it runs: the window and the instant it is
    read at, the caller's scopes (from access.allowed), the Slurm-style filter and the report's
    own options. Built by `build_query`; the same for the CLI and the API."""

    start: datetime
    end: datetime
    now: datetime
    zone: ZoneInfo
    # rows of aggregates; single-job detail (top lists, chains) uses job_scope
    scope: Scope
    job_scope: Scope
    job_filter: JobFilter = field(default_factory=JobFilter)
    # the report's Parameters, by name (defaults filled in)
    options: tuple[tuple[str, Any], ...] = ()
    resubmission_window_seconds: int = 86400
    poll_interval_seconds: int = 60

    def option(self, name: str) -> Any:
        for key, value in self.options:
            if key == name:
                return value
        raise KeyError(f"report option '{name}' not declared")

    def days(self) -> tuple[date, date]:
        """The first and last site day [start, end) touches (reports of whole site days)."""
        from slurmtel.store.reports_admin import window_days

        return window_days(self.start, self.end, self.zone)

    def window_text(self) -> str:
        """The window as every title prints it (reports.render.window_text)."""
        from slurmtel.reports.render import window_text

        return window_text(self.start, self.end, self.zone)

    def days_text(self) -> str:
        """The whole site days a day-grained report covers, printed as any window is."""
        from slurmtel.reports.render import window_text

        first, last = self.days()
        start = datetime.combine(first, time(), self.zone)
        return window_text(start, datetime.combine(last + timedelta(days=1), time(), self.zone), self.zone)


@dataclass(frozen=True)
class Parameter:
    """A report's own option: `--NAME` on the CLI, `?NAME=` on the API."""

    name: str
    kind: type  # int, float, str or bool
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    # smallest value an int/float may take
    minimum: float | None = None

    def parse(self, value: Any) -> Any:
        """VALUE (a CLI or query-string text, or already typed) as this parameter's type;
        ConfigError naming the parameter when it is not one."""
        if value is None:
            return self.default
        flag = f"--{self.name.replace('_', '-')}"
        try:
            if self.kind is bool:
                typed: Any = value if isinstance(value, bool) else _boolean(str(value))
            elif self.kind is int:
                typed = value if isinstance(value, int) else parse_count(str(value), flag, -MAX_COUNT)
                check_count(typed, flag, -MAX_COUNT)
            elif self.kind is float:
                typed = check_number(float(value), flag)
            else:
                typed = check_name(str(value), flag)
        except ValueError:
            raise ConfigError(f"{flag} must be a {self.kind.__name__}, not {shown(value)}") from None
        if self.choices and typed not in self.choices:
            raise ConfigError(f"{flag} must be one of {', '.join(self.choices)}")
        if self.minimum is not None and typed < self.minimum:
            raise ConfigError(f"{flag} must be {self.minimum:g} or more, not {shown(value)}")
        return typed


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class RowsBy:
    """A section whose row type follows one of the report's options (usage --by): the row type
    for each of the option's values."""

    option: str
    types: Mapping[str, RowShape]
    # the key into TYPES when it is not the option's value alone (usage: --by and --tres)
    key: Callable[[ReportQuery], str] | None = None


@dataclass(frozen=True)
class Section:
    """One table of a report. ROW (a row_type, or RowsBy) is its public shape, in column order;
    TABLE_COLUMNS, when given, are the columns a terminal table shows (CSV and JSON show all)."""

    name: str
    row: RowShape | RowsBy
    title: Callable[[ReportQuery, Sequence[Any]], str]
    table_columns: tuple[str, ...] | Callable[[ReportQuery], tuple[str, ...]] | None = None
    # what a table too narrow for every column keeps first: the row's key and the figures that
    # answer the report's question, in order (the other columns follow render's ranking)
    key_columns: tuple[str, ...] | Callable[[ReportQuery], tuple[str, ...]] = ()

    def row_type(self, query: ReportQuery) -> type:
        if isinstance(self.row, RowShape):
            return self.row.type
        key = self.row.key(query) if self.row.key is not None else query.option(self.row.option)
        return self.row.types[key].type

    def row_types(self) -> tuple[type, ...]:
        """Every row type the section can have (the API's schema, the docs test)."""
        shapes = (self.row,) if isinstance(self.row, RowShape) else tuple(self.row.types.values())
        return tuple(shape.type for shape in shapes)

    def columns(self, query: ReportQuery) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.row_type(query)))

    def table(self, query: ReportQuery) -> tuple[str, ...]:
        if self.table_columns is None:
            return self.columns(query)
        return self.table_columns if isinstance(self.table_columns, tuple) else self.table_columns(query)

    def keys(self, query: ReportQuery) -> tuple[str, ...]:
        return self.key_columns if isinstance(self.key_columns, tuple) else self.key_columns(query)


# what a store function returns: rows as mappings by section name
StoreSections = Mapping[str, Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class ReportSpec:
    """A report: who may run it, its options, its sections and the store function it runs."""

    name: str
    help: str
    # the access action whose scope bounds the rows (deny by default: an empty scope refuses)
    action: Action
    sections: tuple[Section, ...]
    run: Callable[[Connection, ReportQuery], StoreSections]
    parameters: tuple[Parameter, ...] = ()
    # cluster-wide reports (nodes, capacity) take -r and -M only
    account_user_filters: bool = True
    # one section printed bare (no JSON object around it, no "# section" line in CSV)
    single: bool = False

    def section(self, name: str) -> Section:
        for s in self.sections:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True)
class ReportResult:
    spec: ReportSpec
    query: ReportQuery
    # section name -> its typed rows, in the spec's section order
    sections: tuple[tuple[str, tuple[Any, ...]], ...]

    def titles(self) -> dict[str, str]:
        return {name: self.spec.section(name).title(self.query, rows) for name, rows in self.sections}


def build_query(
    spec: ReportSpec,
    identity: Identity,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    zone: ZoneInfo,
    job_filter: JobFilter | None = None,
    options: Mapping[str, Any] | None = None,
    resubmission_window_seconds: int = 86400,
    poll_interval_seconds: int = 60,
) -> ReportQuery:
    """The query IDENTITY may run: AccessDenied when allowed() gives it no scope for the spec's
    action; ConfigError for an empty window, an undeclared option or a value of the wrong kind."""
    scope = allowed(identity, spec.action)
    if scope.is_empty:
        raise AccessDenied(
            f"{identity.user} ({identity.role.value}) may not {spec.action.value.replace('_', ' ')}"
        )
    if end <= start:
        raise ConfigError(f"empty window: -E {end.isoformat()} is not after -S {start.isoformat()}")
    wanted = job_filter or JobFilter()
    if not spec.account_user_filters and (wanted.accounts or wanted.users):
        raise ConfigError(f"report {spec.name} is per cluster and partition: -A/-u do not apply")
    given = dict(options or {})
    unknown = sorted(set(given) - {p.name for p in spec.parameters})
    if unknown:
        raise ConfigError(f"report {spec.name} has no option {', '.join(unknown)}")
    return ReportQuery(
        start=start,
        end=end,
        now=now,
        zone=zone,
        scope=scope,
        job_scope=allowed(identity, Action.VIEW_JOBS),
        job_filter=wanted,
        options=tuple((p.name, p.parse(given.get(p.name))) for p in spec.parameters),
        resubmission_window_seconds=resubmission_window_seconds,
        poll_interval_seconds=poll_interval_seconds,
    )


def run_report(conn: Connection, spec: ReportSpec, query: ReportQuery) -> ReportResult:
    """Run SPEC's store function and type its rows. A store row lacking a declared column is an
    error (KeyError); columns the store computes beyond the declared ones are its own helpers
    and are not part of the report."""
    raw = spec.run(conn, query)
    typed = []
    for section in spec.sections:
        cls = section.row_type(query)
        names = [f.name for f in dataclasses.fields(cls)]
        typed.append((section.name, tuple(cls(**{n: r[n] for n in names}) for r in raw[section.name])))
    return ReportResult(spec=spec, query=query, sections=tuple(typed))


def report_document(result: ReportResult) -> dict[str, Any]:
    """RESULT as one plain document, what `write_report` prints and the API sends: per section
    its title, its columns (all, those a terminal table shows, those a narrow one keeps first)
    and its rows as mappings."""
    spec, query = result.spec, result.query
    titles = result.titles()
    return {
        "report": spec.name,
        "single": spec.single,
        "start": query.start,
        "end": query.end,
        "now": query.now,
        "sections": [
            {
                "name": name,
                "title": titles[name],
                "columns": list(spec.section(name).columns(query)),
                "table_columns": list(spec.section(name).table(query)),
                "key_columns": list(spec.section(name).keys(query)),
                "rows": [as_mapping(r) for r in rows],
            }
            for name, rows in result.sections
        ],
    }
