"""The HTML pages of `slurmtel serve` (DESIGN §12): the job page, my month, the reports (the
admin overview) and finance, for people in a browser.

Every page renders a document the read API computes for the same caller — the ReadApi's own
methods (job_document, timeline_document, me_document, report_document, statement_export),
the same functions `slurmtel job`, `me`, `report` and `chargeback` run — and nothing else:
this package imports no SQL and no store (tests/test_layers.py). Identity is the API's
(ReadApi.identity: a trusted proxy's header, Slurm JWT, MUNGE, or serve's local development
user); access is slurmtel.access.allowed through those methods, so a page shows exactly what
the API would answer: another user's job is the same not-found page as a job that does not
exist, and finance pages refuse whoever may not see statements.

Templates are Jinja2 with autoescaping on for every template (job names and reasons are user
input); the charts are inline SVG drawn here (slurmtel.pages.svg); the one stylesheet is in the
base template. Nothing is fetched from elsewhere: no CDN, no script.

Forms that change something (close, void a month) are POSTs carrying a token bound to the
caller (HMAC of the user with a key of this server, CSRF); a POST whose Origin is another site
is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from slurmtel.access import Action, Identity, allowed
from slurmtel.api.app import ApiError, ReadApi, json_response
from slurmtel.columns import table_name, table_value
from slurmtel.errors import AccessDenied, ChargebackError, ConfigError, SlurmtelError
from slurmtel.pages.svg import chart_points, gpu_timeline_svg
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.render import escape_controls, for_table, local_time
from slurmtel.reports.researcher import GPU_TABLE_COLUMNS
from slurmtel.timeparse import month_bounds

log = logging.getLogger(__name__)

# a form may send at most this many bytes (a reason, a token)
MAX_FORM_BYTES = 16 * 1024
# the overview at the top of /reports: (report, section, -S, heading), each the report's own
# section as its page (and `slurmtel report`) shows it, for whoever may run the report
OVERVIEW = (
    ("idle_now", "idle_now", "", "GPUs allocated but idle right now: which jobs, since when"),
    ("failures", "by_account", "now-7days", "Failed GPU-hours, last 7 days"),
    ("queue", "wait_by_partition", "now-1days", "Queue wait"),
    ("taxonomy", "taxonomy", "now-7days", "Where every installed GPU-hour went, last 7 days"),
    ("nodes", "nodes", "now-1days", "Nodes"),
)
# the statement page's line columns first: the line's account, user and partition, what was
# billed and its amount (the JSON's order after them; the downloads keep the files' own order)
STATEMENT_FIRST_COLUMNS = (
    "kind",
    "account",
    "user",
    "partition",
    "gpu_model",
    "billed_quantity",
    "billed_unit",
    "rate",
    "amount",
    "waived_amount",
    "billable_amount",
)
# points per GPU the job page's charts draw (the timeline's JSON and CSV links have every window)
TIMELINE_POINTS = 240
# the job page's GPU table: a terminal table's columns (researcher.GPU_TABLE_COLUMNS) without
# the UUID, as a table shows them without --wide (the CSV and JSON links have every column)
PAGE_GPU_COLUMNS = tuple(c for c in GPU_TABLE_COLUMNS if c != "gpu_uuid")


class PageError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if not value.is_integer() else f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    return str(value)


class Table:
    """Rows as a page shows them: converted by slurmtel.reports.render.for_table, the one place
    a table converts (registered columns in their table units and names, as a terminal shows
    them), instants in the site's zone."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], zone: Any) -> None:
        decoded = [{c: _decoded(c, r.get(c)) for c in columns} for r in rows]
        converted, self.columns = for_table(decoded, columns)
        self.numeric = [False] * len(columns)
        self.rows: list[list[str]] = []
        for row in converted:
            cells = []
            for i, c in enumerate(self.columns):
                value = row.get(c)
                if isinstance(value, datetime):
                    value = local_time(value, zone)
                if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
                    self.numeric[i] = True
                cells.append(_text(value))
            self.rows.append(cells)


def _decoded(column: str, value: Any) -> Any:
    from slurmtel.columns import decode_value

    if isinstance(value, date | datetime | Decimal) or value is None:
        return value
    return decode_value(column, value)


def _finalize(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Markup):
        return escape_controls(value)
    return value


def _csrf(key: bytes, user: str) -> str:
    return hmac.new(key, f"slurmtel-pages:{user}".encode(), hashlib.sha256).hexdigest()


class Pages:
    """The pages over API (its identity, scopes and documents)."""

    def __init__(self, api: ReadApi, *, csrf_key: bytes | None = None) -> None:
        self.api = api
        self.zone = api.config.zone
        self.csrf_key = csrf_key or os.urandom(32)
        self.env = Environment(
            loader=PackageLoader("slurmtel.pages", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            # every text a page prints shows control characters as \xNN, as a terminal table
            # does (job names are user input); Markup (the charts) is already safe
            finalize=_finalize,
        )
        self.env.globals["urlencode"] = urlencode
        self.env.filters["text"] = _text

    # --- the steps every page takes

    def render(
        self, template: str, who: Identity | None, status: int = HTTPStatus.OK, **context: Any
    ) -> Response:
        body = self.env.get_template(template).render(
            who=who,
            nav=self._nav(who),
            zone=str(getattr(self.zone, "key", None) or self.zone),
            **context,
        )
        return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)

    @staticmethod
    def _nav(who: Identity | None) -> list[tuple[str, str]]:
        if who is None:
            return []
        links = []
        if not allowed(who, Action.VIEW_JOBS).is_empty:
            links.append(("/me", "My month"))
        if not allowed(who, Action.VIEW_AGGREGATES).is_empty:
            links.append(("/reports", "Reports"))
        if not allowed(who, Action.VIEW_STATEMENTS).is_empty:
            links.append(("/finance", "Finance"))
        return links

    def guarded(self, page: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """Errors as a page with their status; the reason is said, internals are not."""

        def handle(request: Request) -> Response:
            who: Identity | None = None
            try:
                return page(request)
            except (ApiError, PageError) as exc:
                status, message = exc.status, exc.message
            except AccessDenied as exc:
                status, message = HTTPStatus.FORBIDDEN, str(exc)
            except (ConfigError, ChargebackError) as exc:
                status, message = HTTPStatus.BAD_REQUEST, str(exc)
            except SlurmtelError as exc:
                status, message = HTTPStatus.SERVICE_UNAVAILABLE, f"{exc.kind}: {exc}"
            except Exception as exc:
                log.warning("page %s failed: %s (a bug)", request.url.path, type(exc).__name__)
                log.debug("page %s failed", request.url.path, exc_info=True)
                status, message = HTTPStatus.INTERNAL_SERVER_ERROR, "internal error"
            try:
                who = self.api.identity(request)
            except ApiError:
                who = None
            titles = {
                HTTPStatus.NOT_FOUND: "Not found",
                HTTPStatus.FORBIDDEN: "Not allowed",
                HTTPStatus.UNAUTHORIZED: "Who are you?",
                HTTPStatus.BAD_REQUEST: "Cannot show that",
            }
            return self.render(
                "error.html", who, status, title=titles.get(HTTPStatus(status), "Error"), message=message
            )

        return handle

    def routes(self) -> list[Route]:
        g = self.guarded
        return [
            Route("/", g(self.index)),
            Route("/jobs", g(self.job_lookup)),
            Route("/jobs/{job_id}", g(self.job)),
            Route("/jobs/{job_id}/figures.{fmt}", g(self.job_figures)),
            Route("/jobs/{job_id}/timeline.{fmt}", g(self.job_timeline)),
            Route("/me", g(self.me)),
            Route("/reports", g(self.reports)),
            Route("/reports/{name}", g(self.report)),
            Route("/finance", g(self.finance)),
            Route("/finance/{month}", g(self.statement)),
            Route("/finance/{month}/statement.{fmt}", g(self.statement_file)),
            Route("/finance/{month}/close", g(self.close), methods=["POST"]),
            Route("/finance/{month}/void", g(self.void), methods=["POST"]),
            # last: any other path is the not-found page (JSON under /v1/, as the API answers)
            Route("/{path:path}", self.not_found, methods=["GET", "HEAD", "POST"]),
        ]

    # --- pages

    def not_found(self, request: Request) -> Response:
        """A path that is no page: 404 without asking who calls (nothing is disclosed)."""
        if request.url.path.startswith("/v1/"):
            return json_response({"error": f"no endpoint {request.url.path}"}, HTTPStatus.NOT_FOUND)
        return self.render(
            "error.html", None, HTTPStatus.NOT_FOUND, title="Not found", message="There is no such page."
        )

    def index(self, request: Request) -> Response:
        who = self.api.identity(request)
        return self.render("index.html", who, title="slurmtel")

    def job_lookup(self, request: Request) -> Response:
        """The index's form: /jobs?id=JOBID goes to that job's page (a job id only)."""
        from slurmtel.commands.argtypes import check_job_id

        self.api.identity(request)
        jobid = (request.query_params.get("id") or "").strip()
        if not jobid:
            raise PageError(HTTPStatus.NOT_FOUND, "There is no such page: give a job id")
        try:
            check_job_id(jobid)
        except (ConfigError, ValueError) as exc:
            raise PageError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        return RedirectResponse(f"/jobs/{jobid}", status_code=HTTPStatus.SEE_OTHER)

    def job(self, request: Request) -> Response:
        from slurmtel.reports.researcher import job_header

        who = self.api.identity(request)
        query = self.api.job_query(who, request.path_params["job_id"])
        attempts, timeline = self.api.job_page_documents(query, TIMELINE_POINTS)
        shown = []
        for r in attempts:
            gpus = [g for g in timeline["gpus"] if g["attempt"] == r["attempt"]]
            charts = []
            for g in gpus:
                start = r["start_at"]
                end = r["end_at"] or r.get("so_far_at") or self.api.clock()
                events = [
                    e
                    for e in timeline["events"]
                    if e["gpu_uuid"] == g["gpu_uuid"] and e["attempt"] == r["attempt"]
                ]
                charts.append(
                    gpu_timeline_svg(
                        g,
                        start=start,
                        end=end,
                        zone=self.zone,
                        events=events,
                        max_points=chart_points(len(gpus)),
                    )
                )
            fabric = self._fabric(who, r)
            shown.append(
                {
                    "r": r,
                    "fabric": fabric,
                    "header": job_header(r, self.zone),
                    "gpu_table": Table(r["gpu_figures"], PAGE_GPU_COLUMNS, self.zone),
                    "idle_gpus": [g["gpu"] for g in gpus if g["idle_gpu"]],
                    "charts": charts,
                    "events": Table(
                        [e for e in timeline["events"] if e["attempt"] == r["attempt"]],
                        ("event_at", "gpu", "event_kind", "event_value", "event_detail"),
                        self.zone,
                    ),
                }
            )
        latest = attempts[0]
        return self.render(
            "job.html",
            who,
            title=f"Job {latest['job_id']}",
            job_id=latest["job_id"],
            name=latest["name"],
            cluster=latest["cluster"],
            attempts=shown,
        )

    def job_figures(self, request: Request) -> Response:
        """The job's document as JSON (what `/v1/jobs/{id}` and `slurmtel job --format json`
        give) or its per-GPU figures as CSV (GPU_COLUMNS, one row per GPU and attempt)."""
        from slurmtel.reports.researcher import GPU_COLUMNS, jsonable

        fmt = request.path_params["fmt"]
        who = self.api.identity(request)
        query = self.api.job_query(who, request.path_params["job_id"])
        attempts = self.api.job_document(query)
        if fmt == "json":
            return _private(json_response(jsonable(attempts)))
        if fmt != "csv":
            raise PageError(HTTPStatus.NOT_FOUND, f"figures are json or csv, not {fmt}")
        rows = [
            {"job_id": r["job_id"], "attempt": r["attempt"], **g} for r in attempts for g in r["gpu_figures"]
        ]
        return self._csv(rows, ("job_id", "attempt", *GPU_COLUMNS), f"job-{query.jobid}-gpus.csv")

    def job_timeline(self, request: Request) -> Response:
        from slurmtel.reports.researcher import TIMELINE_POINT_COLUMNS, jsonable

        fmt = request.path_params["fmt"]
        who = self.api.identity(request)
        query = self.api.job_query(who, request.path_params["job_id"])
        timeline = self.api.timeline_document(query)
        if fmt == "json":
            return _private(json_response(jsonable(timeline)))
        if fmt != "csv":
            raise PageError(HTTPStatus.NOT_FOUND, f"timelines are json or csv, not {fmt}")
        rows = [
            {"attempt": g["attempt"], "gpu": g["gpu"], "gpu_uuid": g["gpu_uuid"], **p}
            for g in timeline["gpus"]
            for p in g["points"]
        ]
        return self._csv(
            rows, ("attempt", "gpu", "gpu_uuid", *TIMELINE_POINT_COLUMNS), f"job-{query.jobid}-timeline.csv"
        )

    def me(self, request: Request) -> Response:
        from slurmtel.reports.researcher import ME_JOBS_COLUMNS, ME_SUMMARY_COLUMNS, TOP_COLUMNS

        who = self.api.identity(request)
        params = {k: v for k, v in request.query_params.items() if k in ("month", "user") and v}
        summary_doc = self.api.me_document(who, params)
        jobs_doc = self.api.me_document(who, {**params, "jobs": "1"})
        summary = summary_doc["summary"]
        figures = [
            {"figure": k, "value": summary.get(k)}
            for k in (*ME_SUMMARY_COLUMNS, "gpu_energy_joules", "gpu_energy_amount", "gpu_co2e_kilograms")
            if k in ME_SUMMARY_COLUMNS or summary.get(k) is not None
        ]
        figure_rows = [
            {
                "figure": table_name(f["figure"]),
                "value": _text(table_value(f["figure"], _decoded(f["figure"], f["value"]))),
            }
            for f in figures
        ]
        jobs = jobs_doc["jobs"]
        flags = [_flags(j) for j in jobs]
        coordinated = None
        if who.coordinated_accounts:
            start, end = _month_window(summary_doc["month"])
            coordinated = self.api.report_document(
                who,
                "usage",
                {
                    "by": "user",
                    "accounts": ",".join(sorted(who.coordinated_accounts)),
                    "start": start,
                    "end": end,
                },
            )
        return self.render(
            "me.html",
            who,
            title=f"{summary_doc['user']} in {summary_doc['month']}",
            doc=summary_doc,
            figures=figure_rows,
            top=Table(summary_doc["top_jobs"], TOP_COLUMNS, self.zone),
            top_ids=[t["job_id"] for t in summary_doc["top_jobs"]],
            jobs=Table(jobs, ME_JOBS_COLUMNS, self.zone),
            job_ids=[j["job_id"] for j in jobs],
            flags=flags,
            coordinated=self._sections(coordinated) if coordinated else None,
            warnings=[*summary_doc.get("warnings", [])],
        )

    def reports(self, request: Request) -> Response:
        from slurmtel.commands.view_catalog import VIEWS

        who = self.api.identity(request)
        if allowed(who, Action.VIEW_AGGREGATES).is_empty:
            raise PageError(HTTPStatus.FORBIDDEN, f"{who.user} ({who.role.value}) may not view aggregates")
        listed = [
            (name, spec.help) for name, spec in REPORTS.items() if not allowed(who, spec.action).is_empty
        ] + [(name, view.help) for name, view in VIEWS.items() if not allowed(who, view.action).is_empty]
        overview = []
        for name, section, start, heading in OVERVIEW:
            action = VIEWS[name].action if name in VIEWS else REPORTS[name].action
            if allowed(who, action).is_empty:
                continue
            doc = self.api.report_document(who, name, {"start": start} if start else {})
            shown = [s for s in self._sections(doc) if s["name"] == section]
            overview += [{**s, "report": name, "start": start, "heading": heading} for s in shown]
        return self.render("reports.html", who, title="Reports", reports=listed, overview=overview)

    def report(self, request: Request) -> Response:
        """Report NAME of the catalog (or a view) with its filters as a form (GET)."""
        from slurmtel.commands.view_catalog import VIEWS

        who = self.api.identity(request)
        name = request.path_params["name"]
        params = {k: v for k, v in request.query_params.items() if v}
        doc = self.api.report_document(who, name, params)
        if name in VIEWS:
            view = VIEWS[name]
            fields = [
                *(("start", "end") if view.window else ()),
                *view.filters,
                *(p.name for p in view.parameters),
            ]
            parameters = view.parameters
            help_text = view.help
        else:
            spec = REPORTS[name]
            fields = [
                "start",
                "end",
                *(("accounts", "users") if spec.account_user_filters else ()),
                "partitions",
                "clusters",
                *(p.name for p in spec.parameters),
            ]
            parameters = spec.parameters
            help_text = spec.help
        choices = {p.name: p.choices for p in parameters}
        helps = {p.name: p.help for p in parameters}
        return self.render(
            "report.html",
            who,
            title=f"Report {name}",
            name=name,
            help=help_text,
            fields=[(f, params.get(f, ""), choices.get(f, ()), helps.get(f, "")) for f in fields],
            window=_window_text(doc, self.zone),
            sections=self._sections(doc),
            warnings=doc.get("warnings", []),
            json_link=f"/v1/reports/{name}" + (f"?{urlencode(params)}" if params else ""),
        )

    def finance(self, request: Request) -> Response:
        from slurmtel.chargeback.export import audit_listing, statement_listing
        from slurmtel.commands.finance import AUDIT_COLUMNS, LISTING_COLUMNS
        from slurmtel.reports.researcher import month_of

        who = self.api.identity(request)
        self.api.scope(who, Action.VIEW_STATEMENTS)
        engine = self.api.statements_engine
        listing = statement_listing(engine)
        now = self.api.clock()
        return self.render(
            "finance.html",
            who,
            title="Finance",
            listing=Table(listing, LISTING_COLUMNS, self.zone),
            months=[r["month"] for r in listing],
            audit=Table(audit_listing(engine), AUDIT_COLUMNS, self.zone),
            this_month=month_of(now, self.zone),
        )

    def statement(self, request: Request) -> Response:
        from slurmtel.chargeback.export import statement_listing

        who = self.api.identity(request)
        month = request.path_params["month"]
        exported = self.api.statement_export(who, month, "json")
        document = json.loads(exported.data)
        lines = document.get("lines", [])
        # what finance reads first (who, what, how much), then every other column of the line
        every = list(lines[0]) if lines else []
        first = [c for c in STATEMENT_FIRST_COLUMNS if c in every]
        columns = [*first, *(c for c in every if c not in first)]
        closed = [
            r
            for r in statement_listing(self.api.statements_engine)
            if r["month"] == month and r["status"] == "closed"
        ]
        may_close = not allowed(who, Action.CLOSE_STATEMENTS).is_empty
        _, month_end = month_bounds(month, self.zone)
        ended = month_end <= self.api.clock()
        totals = document.get("totals") or {}
        return self.render(
            "statement.html",
            who,
            title=f"Statement {month}",
            month=month,
            currency=document.get("currency", ""),
            closed=closed[0] if closed else None,
            notices=exported.notices,
            totals=[(k, _text(v)) for k, v in totals.items() if not isinstance(v, list | dict)],
            lines=Table(lines, columns, self.zone),
            may_close=may_close,
            ended=ended,
            csrf=_csrf(self.csrf_key, who.user),
            message=request.query_params.get("done", ""),
        )

    def statement_file(self, request: Request) -> Response:
        """The month's statement as `slurmtel chargeback --month M --format FMT` writes it."""
        from slurmtel.chargeback.export import statement_parquet

        who = self.api.identity(request)
        month, fmt = request.path_params["month"], request.path_params["fmt"]
        if fmt == "parquet":
            scope = self.api.scope(who, Action.VIEW_STATEMENTS)
            data = statement_parquet(
                self.api.statements_engine, self.api.config, month, self.api.clock(), scope=scope
            )
            media = "application/vnd.apache.parquet"
        elif fmt in ("csv", "json"):
            data = self.api.statement_export(who, month, fmt).data
            media = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
        else:
            raise PageError(HTTPStatus.NOT_FOUND, f"statements are csv, json or parquet, not {fmt}")
        return Response(
            data,
            media_type=media,
            headers={
                "Content-Disposition": f'attachment; filename="slurmtel-{month}.{fmt}"',
                **SECURITY_HEADERS,
            },
        )

    def close(self, request: Request) -> Response:
        who, month, reason = self._changing(request)
        exported = self.api.statement_export(who, month, "csv", close=True, reason=reason)
        if exported.refused:
            raise PageError(HTTPStatus.CONFLICT, "; ".join(exported.notices[-1:]))
        return RedirectResponse(f"/finance/{month}?done=closed", status_code=HTTPStatus.SEE_OTHER)

    def void(self, request: Request) -> Response:
        from slurmtel.chargeback import void_month

        who, month, reason = self._changing(request)
        if not reason:
            raise PageError(HTTPStatus.BAD_REQUEST, "voiding a statement needs a reason: it is kept with it")
        self.api.scope(who, Action.CLOSE_STATEMENTS)
        from slurmtel.chargeback import check_month

        void_month(self.api.statements_engine, check_month(month), self.api.clock(), who.user, reason)
        return RedirectResponse(f"/finance/{month}?done=voided", status_code=HTTPStatus.SEE_OTHER)

    # --- helpers

    def _changing(self, request: Request) -> tuple[Identity, str, str]:
        """A POST that changes something: its caller (who may close statements), its month and
        reason; refused without this server's token for the caller, or from another site."""
        who = self.api.identity(request)
        self.api.scope(who, Action.CLOSE_STATEMENTS)
        origin = request.headers.get("origin")
        if origin and origin != "null":
            host = urlsplit(origin).netloc
            if host != request.headers.get("host", ""):
                raise PageError(HTTPStatus.FORBIDDEN, "a form from another site may not change statements")
        form = _read_form(request)
        token = form.get("csrf", "")
        if not hmac.compare_digest(token, _csrf(self.csrf_key, who.user)):
            raise PageError(HTTPStatus.FORBIDDEN, "the form's token is missing or not yours: reload the page")
        return who, request.path_params["month"], form.get("reason", "").strip()

    def _fabric(self, who: Identity, r: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """For whoever may see the fabric (admins): the acceptance runs (report fabric) that used
        the attempt's nodes from a day before it started until it ended, and the port and NVLink
        counters of its nodes while it ran (report fabric_nodes); None for others or an attempt
        that never ran."""
        if allowed(who, Action.VIEW_OPERATIONS).is_empty or not r["start_at"] or not r["nodes"]:
            return None
        end = r["end_at"] or r.get("so_far_at") or self.api.clock()

        def local(moment: datetime) -> str:
            return moment.astimezone(self.zone).strftime("%Y-%m-%dT%H:%M:%S")

        nodes = set(r["nodes"])
        before = {"start": local(r["start_at"] - timedelta(days=1)), "end": local(end)}
        runs = self.api.report_document(who, "fabric", before)
        shown = []
        for section in runs.get("sections", []):
            if section["name"] != "runs":
                continue
            rows = [row for row in section["rows"] if nodes & _node_set(row.get("nodes"))]
            shown.append(
                {
                    "name": "acceptance",
                    "title": f"Acceptance runs on its nodes from a day before it started: {len(rows)}",
                    "table": Table(rows, section.get("table_columns") or section["columns"], self.zone),
                    "link": f"/reports/fabric?{urlencode(before)}",
                }
            )
        window = {"start": local(r["start_at"]), "end": local(end), "nodes": ",".join(r["nodes"])}
        doc = self.api.report_document(who, "fabric_nodes", window)
        shown += [{**s, "link": f"/reports/fabric_nodes?{urlencode(window)}"} for s in self._sections(doc)]
        return shown

    def _sections(self, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
        shown = []
        for s in doc.get("sections", []):
            columns = s.get("table_columns") or s["columns"]
            shown.append(
                {"name": s["name"], "title": s["title"], "table": Table(s["rows"], columns, self.zone)}
            )
        return shown

    def _csv(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], filename: str) -> Response:
        from slurmtel.reports.render import render

        out = io.StringIO()
        render(rows, out, "csv", columns=columns)
        return Response(
            out.getvalue().encode(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"', **SECURITY_HEADERS},
        )


# no page may be framed by another site, no script runs, nothing loads from elsewhere
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # a page holds one caller's figures: no shared cache (a proxy's) may keep it for another
    "Cache-Control": "private, no-store",
}


def _private(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _read_form(request: Request) -> dict[str, str]:
    """The urlencoded body of a POST (at most MAX_FORM_BYTES), read in the endpoint's thread."""
    from urllib.parse import parse_qs

    import anyio.from_thread

    async def body() -> bytes:
        return await request.body()

    data = anyio.from_thread.run(body)
    if len(data) > MAX_FORM_BYTES:
        raise PageError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "the form is too large")
    parsed = parse_qs(data.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def _node_set(value: Any) -> set[str]:
    """A row's nodes: a list, or the comma-separated text a report gives."""
    if isinstance(value, str):
        return {n.strip() for n in value.split(",") if n.strip()}
    return set(value or ())


def _flags(job: Mapping[str, Any]) -> list[str]:
    from slurmtel.reports.advice import IDLE_GPU_SHARE

    flags = []
    if job.get("idle_share") is not None and float(job["idle_share"]) >= IDLE_GPU_SHARE:
        flags.append("idle GPUs")
    state = str(job.get("state") or "")
    if state in ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"):
        flags.append("failed")
    if state == "TIMEOUT":
        flags.append("hit its time limit")
    return flags


def _month_window(month: str) -> tuple[str, str]:
    year, number = (int(x) for x in month.split("-"))
    following = f"{year + number // 12:04d}-{number % 12 + 1:02d}"
    return f"{month}-01T00:00:00", f"{following}-01T00:00:00"


def _window_text(doc: Mapping[str, Any], zone: Any) -> str:
    from slurmtel.reports.render import window_text

    start, end = doc.get("start"), doc.get("end")
    if not start or not end:
        return ""
    start = start if isinstance(start, datetime) else datetime.fromisoformat(str(start))
    end = end if isinstance(end, datetime) else datetime.fromisoformat(str(end))
    return window_text(start, end, zone)
