"""Reports that are not report specs (cost, budget, fabric, nodes --drift) as report documents:
one function per view computes the document the CLI prints on the head, the read API sends and
a login node's CLI prints from the API — the same shape as a spec's (reports.spec.
report_document: sections with their title, columns, table and key columns, rows), with the
warnings the head prints beside it.

A view's function takes the config, a ViewRequest (who asks, the data's now, the window and
filters as given, its typed options) and a Connect: what opens a connection for a scope (the
CLI's engine; the API's scoped transaction). It checks every value before it connects, so a
refused command starts no database.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from slurmtel.access import Action, Identity, Scope
from slurmtel.filters import JobFilter
from slurmtel.reports.spec import Parameter

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from slurmtel.config import Config

Connect = Callable[[Scope], AbstractContextManager["Connection"]]
Document = dict[str, Any]


@dataclass(frozen=True)
class ViewRequest:
    identity: Identity
    now: datetime
    start: str | None = None
    end: str | None = None
    job_filter: JobFilter = field(default_factory=JobFilter)
    options: Mapping[str, Any] = field(default_factory=dict)

    def option(self, name: str) -> Any:
        return self.options[name]


@dataclass(frozen=True)
class View:
    """A report that is not a spec: its name (`/v1/reports/NAME`), the access action it needs,
    its options, whether it takes -S/-E and which filters, and the function making its
    document."""

    name: str
    help: str
    action: Action
    build: Callable[[Config, ViewRequest, Connect], Document]
    # the rows it can have: (section, or the option it depends on, its columns), for the API's
    # schema and docs/reports.md
    sections: tuple[tuple[str, tuple[str, ...]], ...]
    parameters: tuple[Parameter, ...] = ()
    window: bool = True
    filters: tuple[str, ...] = ("partitions", "clusters")

    def request(
        self,
        identity: Identity,
        now: datetime,
        *,
        start: str | None = None,
        end: str | None = None,
        job_filter: JobFilter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> ViewRequest:
        """The request, its options parsed and checked (ConfigError naming a bad one)."""
        from slurmtel.errors import ConfigError

        given = dict(options or {})
        unknown = sorted(set(given) - {p.name for p in self.parameters})
        if unknown:
            raise ConfigError(f"report {self.name} has no option {', '.join(unknown)}")
        wanted = job_filter or JobFilter()
        for kind in ("accounts", "users", "partitions", "clusters"):
            if getattr(wanted, kind) and kind not in self.filters:
                flag = {"accounts": "-A", "users": "-u", "partitions": "-r", "clusters": "-M"}[kind]
                raise ConfigError(f"report {self.name}: {flag} does not apply")
        return ViewRequest(
            identity,
            now,
            start if self.window else None,
            end if self.window else None,
            wanted,
            {p.name: p.parse(given.get(p.name)) for p in self.parameters},
        )


def section(
    name: str,
    title: str,
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    table_columns: Sequence[str] | None = None,
    key_columns: Sequence[str] = (),
) -> dict[str, Any]:
    """One section of a document: its rows cut to COLUMNS (registered names only)."""
    from slurmtel.columns import column

    for name_ in columns:
        column(name_)
    return {
        "name": name,
        "title": title,
        "columns": list(columns),
        "table_columns": list(table_columns if table_columns is not None else columns),
        "key_columns": list(key_columns),
        "rows": [{c: r.get(c) for c in columns} for r in rows],
    }


def document(
    name: str,
    sections: Sequence[dict[str, Any]],
    *,
    now: datetime,
    start: datetime | None = None,
    end: datetime | None = None,
    warnings: Sequence[str] = (),
    single: bool = False,
    transpose: bool = False,
) -> Document:
    """A view's document; TRANSPOSE: its one row is a figure/value table on a terminal."""
    return {
        "report": name,
        "single": single,
        "transpose": transpose,
        "start": start,
        "end": end,
        "now": now,
        "sections": list(sections),
        "warnings": list(warnings),
    }


def run_cli(view: View, config: Config, request_args: Mapping[str, Any], fmt: str) -> int:
    """`slurmtel report NAME` of a view: through the read API when the config names one (a
    login node), else computed here over the configured database; warnings on stderr."""
    from slurmtel.commands import common
    from slurmtel.commands.sections import write_report

    options = request_args.get("options", {})
    wanted = request_args.get("job_filter") or JobFilter()
    start, end = request_args.get("start"), request_args.get("end")
    if config.api.url:
        from slurmtel.api.client import ApiClient

        doc = ApiClient(config).report(view.name, start=start, end=end, job_filter=wanted, options=options)
    else:
        identity = common.current_identity(config)
        request = view.request(
            identity, common.site_now(config), start=start, end=end, job_filter=wanted, options=options
        )

        def connect(scope: Scope) -> AbstractContextManager[Connection]:
            return common.open_context(config).engine.connect()

        doc = view.build(config, request, connect)
    for line in doc.get("warnings", ()):
        print(f"slurmtel: warning: {line}", file=sys.stderr)
    write_report(doc, sys.stdout, fmt)
    return common.EXIT_OK


def scope_of(identity: Identity, action: Action) -> Scope:
    """The caller's scope for ACTION; AccessDenied when it is empty (deny by default)."""
    from slurmtel.access import allowed
    from slurmtel.errors import AccessDenied

    scope = allowed(identity, action)
    if scope.is_empty:
        raise AccessDenied(
            f"{identity.user} ({identity.role.value}) may not {action.value.replace('_', ' ')}"
        )
    return scope
