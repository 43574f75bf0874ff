"""The read API's OpenAPI 3.1 document, generated from the report specs: a report added to
slurmtel.reports.catalog.REPORTS appears here with its parameters and row schemas, and
tests/test_api.py checks every path here is served."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from slurmtel import __version__
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.spec import ReportSpec, json_type

if TYPE_CHECKING:
    from slurmtel.commands.views import View

SECURITY: list[dict[str, list[str]]] = [{"munge": []}, {"slurmJwt": []}]
ERROR = {
    "description": "refused or failed; the reason is in `error`",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


WINDOW_PARAMETERS = [
    _query("start", "window start in the site's zone, sacct forms (default: the 1st of this month)"),
    _query("end", "window end (default: now)"),
    _query("accounts", "comma-separated accounts (-A)"),
    _query("users", "comma-separated users (-u)"),
    _query("partitions", "comma-separated partitions (-r)"),
    _query("clusters", "comma-separated clusters (-M)"),
]


def _row_schema(columns: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {c: json_type(c) for c in columns},
        "required": list(columns),
    }


def _report_path(spec: ReportSpec) -> dict[str, Any]:
    parameters = list(WINDOW_PARAMETERS)
    for p in spec.parameters:
        schema: dict[str, Any] = {
            "type": {int: "integer", float: "number", bool: "boolean"}.get(p.kind, "string")
        }
        if p.choices:
            schema["enum"] = list(p.choices)
        if p.minimum is not None:
            schema["minimum"] = p.minimum
        if p.default is not None:
            schema["default"] = p.default
        parameters.append(_query(p.name, p.help, schema))
    sections = []
    for section in spec.sections:
        schemas = [_row_schema(tuple(f.name for f in dataclasses.fields(t))) for t in section.row_types()]
        # a row type that follows an option (report usage --by): one schema per choice
        rows = schemas[0] if len(schemas) == 1 else {"oneOf": schemas}
        sections.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": section.name},
                    "title": {"type": "string"},
                    "columns": {"type": "array", "items": {"type": "string"}},
                    "table_columns": {"type": "array", "items": {"type": "string"}},
                    "key_columns": {"type": "array", "items": {"type": "string"}},
                    "rows": {"type": "array", "items": rows},
                },
            }
        )
    return {
        "get": {
            "operationId": f"report_{spec.name}",
            "summary": spec.help,
            "description": f"Access: {spec.action.value} (slurmtel.access.allowed); rows outside the caller's scope are never read.",
            "parameters": parameters,
            "security": SECURITY,
            "responses": {
                "200": {
                    "description": f"report {spec.name}",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "report": {"const": spec.name},
                                    "single": {"type": "boolean"},
                                    "start": {"type": "string", "format": "date-time"},
                                    "end": {"type": "string", "format": "date-time"},
                                    "now": {"type": "string", "format": "date-time"},
                                    "sections": {"type": "array", "prefixItems": sections, "items": False},
                                    # the CLI prints them as `slurmtel: warning: ...`, as on the head
                                    "warnings": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "description": "filter values (-A/-u/-r/-M) the data the caller "
                                        "may see has never held: \"no such user 'x' in the data you may see\"",
                                    },
                                },
                            }
                        }
                    },
                },
                "400": ERROR,
                "401": ERROR,
                "403": ERROR,
            },
        }
    }


def _simple(
    operation: str,
    summary: str,
    parameters: list[dict[str, Any]],
    media: str = "application/json",
    method: str = "get",
) -> dict[str, Any]:
    return {
        method: {
            "operationId": operation,
            "summary": summary,
            "parameters": parameters,
            "security": SECURITY,
            "responses": {
                "200": {"description": summary, "content": {media: {}}},
                "401": ERROR,
                "403": ERROR,
                "404": ERROR,
            },
        }
    }


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _view_path(view: View) -> dict[str, Any]:
    """A report that is not a spec (slurmtel.commands.views): its options, filters and rows."""
    parameters = [p for p in WINDOW_PARAMETERS[:2] if view.window] + [
        p for p in WINDOW_PARAMETERS[2:] if p["name"] in view.filters
    ]
    for p in view.parameters:
        schema: dict[str, Any] = {
            "type": {int: "integer", float: "number", bool: "boolean"}.get(p.kind, "string")
        }
        if p.choices:
            schema["enum"] = list(p.choices)
        if p.minimum is not None:
            schema["minimum"] = p.minimum
        parameters.append(_query(p.name, p.help, schema))
    rows = [_row_schema(columns) for _, columns in view.sections]
    return {
        "get": {
            "operationId": f"report_{view.name}",
            "summary": view.help,
            "description": f"Access: {view.action.value} (slurmtel.access.allowed).",
            "parameters": parameters,
            "security": SECURITY,
            "responses": {
                "200": {
                    "description": f"report {view.name}",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "report": {"const": view.name},
                                    "sections": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "rows": {
                                                    "type": "array",
                                                    "items": rows[0] if len(rows) == 1 else {"oneOf": rows},
                                                }
                                            },
                                        },
                                    },
                                    "warnings": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        }
                    },
                },
                "400": ERROR,
                "401": ERROR,
                "403": ERROR,
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    from slurmtel.commands.view_catalog import VIEWS

    paths: dict[str, Any] = {f"/v1/reports/{name}": _report_path(spec) for name, spec in REPORTS.items()}
    paths.update({f"/v1/reports/{name}": _view_path(view) for name, view in VIEWS.items()})
    job = _path("job_id", "123, array task 10_4, het component 123+1")
    clusters = _query("clusters", "comma-separated clusters")
    paths["/v1/jobs/{job_id}"] = _simple(
        "job", "one job's attempts, GPUs and advice (slurmtel job)", [job, clusters]
    )
    paths["/v1/jobs/{job_id}/plot.{fmt}"] = _simple(
        "job_plot",
        "one job's GPU utilisation, memory and power over time (slurmtel job --plot)",
        [job, _path("fmt", "png, svg or pdf"), clusters],
        media="image/png",
    )
    paths["/v1/jobs/{job_id}/timeline"] = _simple(
        "job_timeline",
        "one job's per-GPU windows (utilisation, memory, power) and the XID/ECC events of its GPUs "
        "while it ran: what the job page draws",
        [
            job,
            clusters,
            _query(
                "points",
                "at most this many points per GPU: slices of the attempt, each the highest of its windows",
                {"type": "integer", "minimum": 1},
            ),
        ],
    )
    paths["/v1/me"] = _simple(
        "me",
        "the caller's month: GPU-hours, idle share, failures, top jobs (slurmtel me)",
        [
            _query("user", "another user (admins; coordinators for their accounts)"),
            _query("month", "YYYY-MM (default: this month)"),
            _query("jobs", "1: every attempt of the month instead", {"type": "boolean"}),
            _query("top", "top jobs listed (default 10)", {"type": "integer", "minimum": 1}),
        ],
    )
    paths["/v1/actions"] = _simple(
        "actions",
        "the record of messages and actions (slurmtel act log): a user's own jobs', admins' all",
        [
            _query("start", "from (sacct's forms; default 30 days ago)"),
            _query("end", "to (default now)"),
            _query("user", "only this user's"),
            _query("job", "only this job id's"),
            _query("rule", "only this rule's"),
            _query("limit", "at most this many (default 100)", {"type": "integer", "minimum": 1}),
        ],
    )
    month = _path("month", "YYYY-MM")
    fmt = _query("format", "csv (default) or json", {"enum": ["csv", "json"]})
    paths["/v1/chargeback/{month}"] = _simple(
        "statement", "a month's chargeback statement (finance, admins)", [month, fmt], media="text/csv"
    )
    paths["/v1/chargeback/{month}/close"] = _simple(
        "close_month",
        "close a month: store its statement once (finance, admins)",
        [month, fmt],
        media="text/csv",
        method="post",
    )
    paths["/v1/whoami"] = _simple(
        "whoami", "who the server takes the caller for: user, role, coordinated accounts", []
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "slurmtel read API", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "munge": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "'MUNGE <credential>', payload 'METHOD PATH NONCE' of the request",
                },
                "slurmJwt": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-SLURM-USER-TOKEN",
                    "description": "scontrol token (HS256)",
                },
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}},
                    "required": ["error"],
                }
            },
        },
    }
