"""`slurmtel serve`: the read API (DESIGN §7–§8). Every view the CLI computes from the database,
served as JSON to callers who prove who they are.

Starlette on uvicorn: a maintained ASGI stack that parses HTTP for us (uvicorn's h11/httptools)
and routes without a framework's ORM or templating; endpoints are plain functions run in a
thread pool, since each does blocking work (unmunge, one database transaction).

Per request, in this order, deny by default:
1. slurmtel.auth.authenticate: MUNGE, Slurm JWT or a trusted proxy's header -> Identity, or
   401/403/503 with the reason;
2. slurmtel.access.allowed for the view's action -> Scope, or 403;
3. one database transaction whose row-level security settings are that scope
   (slurmtel.store.rls), so the reader role returns no row outside it even if a query forgot;
4. the same function the CLI runs (reports.spec.run_report, reports.researcher, chargeback).

A job outside the caller's scope answers 404 "not found or not yours", exactly like a job that
does not exist. Each endpoint's document comes from a method of its own (report_document,
job_document, timeline_document, me_document, statement_export): the HTML pages
(slurmtel.pages, routed beside these by `slurmtel serve`) call the same methods, so a page shows
what the API answers the same caller. /healthz and /v1/openapi.json hold no data and need no credential.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from slurmtel.access import Action, Identity, Scope, allowed
from slurmtel.api.limits import ListenerState
from slurmtel.auth.identity import AuthSettings, Denied, RequestView, authenticate
from slurmtel.bounds import check_names, parse_count
from slurmtel.commands.common import unknown_filter_warnings
from slurmtel.commands.views import View
from slurmtel.config import Config
from slurmtel.errors import AccessDenied, ChargebackError, ConfigError, SlurmtelError
from slurmtel.filters import JobFilter
from slurmtel.listen import EveryInterval, log_limited
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.spec import build_query, report_document, run_report
from slurmtel.timeparse import report_window

log = logging.getLogger(__name__)

PLOT_TYPES = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf"}
# coordinators are looked up with sacctmgr: remembered this long per user
COORDINATORS_TTL_SECONDS = 60.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def wire(value: Any) -> Any:
    """JSON for what a JSON encoder does not know: exact decimals and instants as text."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def json_response(document: Any, status: int = HTTPStatus.OK) -> Response:
    body = json.dumps(document, default=wire, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


class CoordinatorCache:
    """user -> accounts they coordinate (sub-accounts included), asked of sacctmgr at most once
    a minute per user: a request must not cost a slurmdbd round trip."""

    def __init__(
        self, lookup: Callable[[str], frozenset[str]], ttl_seconds: float = COORDINATORS_TTL_SECONDS
    ):
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, frozenset[str]]] = {}

    def __call__(self, user: str) -> frozenset[str]:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(user)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
        accounts = self._lookup(user)
        with self._lock:
            self._entries[user] = (now, accounts)
        return accounts


class ReadApi:
    """The endpoints over ENGINE (the reader role, scoped per transaction) and STATEMENTS_ENGINE
    (every row: see slurmtel.store.rls.scope_sessions_to_everything). CLOCK is the data's now
    (site.clock); AUTH_CLOCK the wall clock credentials are checked against. SCOPE_KEY (by
    default api.scope_key_file's) proves each transaction's scope to row security; with
    CHECK_DATABASE the database is asked at once whether it takes those proofs
    (ScopeKeyRefused when ENGINE's role is filtered and it does not)."""

    def __init__(
        self,
        config: Config,
        engine: Engine,
        settings: AuthSettings,
        clock: Callable[[], datetime],
        statements_engine: Engine | None = None,
        auth_clock: Callable[[], datetime] | None = None,
        *,
        scope_key: bytes | None = None,
        check_database: bool = True,
        dev_user: str = "",
    ):
        from slurmtel.store.rls import check_scope_proofs, load_scope_key, sign_scopes

        self.config = config
        self.engine = engine
        # statements and closings: every row (finance and admins only), and a role that may
        # store a closed statement
        self.statements_engine = statements_engine or engine
        # row security takes only scopes proven with the key (api.scope_key_file); checked
        # now, so a server whose proofs the database refuses stops at start with the reason
        # instead of answering everyone with no rows
        key = scope_key if scope_key is not None else load_scope_key(config.api.scope_key_file)
        if key is not None:
            for each in {id(engine): engine, id(self.statements_engine): self.statements_engine}.values():
                sign_scopes(each, key)
        if check_database:
            check_scope_proofs(engine)
        self.settings = settings
        self.clock = clock
        # credentials are fresh or not by the wall clock, whatever site.clock says of the data
        self.auth_clock = auth_clock or (lambda: datetime.now(UTC))
        # `slurmtel serve --dev-user NAME` (loopback only, checked by serve): every request
        # from this machine is NAME, with NAME's role as the CLI resolves it
        self.dev_user = dev_user

    # --- the steps every endpoint takes

    def identity(self, request: Request) -> Identity:
        if self.dev_user:
            return self._dev_identity(request)
        view = RequestView(
            method=request.method,
            path=request.url.path,
            headers=tuple((k, v) for k, v in request.headers.items()),
            peer_address=request.client.host if request.client else "",
            # as sent: a MUNGE credential is bound to it
            query=request.scope.get("query_string", b"").decode("latin-1"),
        )
        result = authenticate(view, self.settings, self.auth_clock())
        if isinstance(result, Denied):
            raise ApiError(int(result.status), result.reason)
        return result

    def _dev_identity(self, request: Request) -> Identity:
        from slurmtel.auth.identity import identity_for
        from slurmtel.auth.proxy import LOOPBACK, peer_in

        peer = request.client.host if request.client else ""
        if not peer_in(peer, LOOPBACK):
            raise ApiError(HTTPStatus.UNAUTHORIZED, f"development identity: {peer} is not this machine")
        return identity_for(self.dev_user, None, self.settings.access, self.settings.coordinators)

    @staticmethod
    def scope(identity: Identity, action: Action) -> Scope:
        scope = allowed(identity, action)
        if scope.is_empty:
            raise ApiError(
                HTTPStatus.FORBIDDEN,
                f"{identity.user} ({identity.role.value}) may not {action.value.replace('_', ' ')}",
            )
        return scope

    @contextmanager
    def transaction(self, scope: Scope) -> Iterator[Connection]:
        """A transaction whose row-level security admits SCOPE's rows only."""
        from slurmtel.store.rls import set_transaction_scope

        with self.engine.begin() as conn:
            set_transaction_scope(conn, scope)
            yield conn

    @contextmanager
    def job_transaction(self, scope: Scope) -> Iterator[Connection]:
        """transaction(SCOPE) for the reads of one job, planned once per connection: a statement
        psycopg has prepared (run five times on the connection) keeps one generic plan. The
        job's statements plan their partitions and lateral reads for 2-4 ms, more than they
        take to run, and every job gives them the same shape (a few attempts, their GPUs); its
        span still leaves out partitions, when the plan starts (benchmarks/job_sql.py)."""
        from slurmtel.store.sql import plan_once

        with self.transaction(scope) as conn:
            plan_once(conn)
            yield conn

    # --- endpoints

    def whoami(self, request: Request) -> Response:
        who = self.identity(request)
        return json_response(
            {
                "user": who.user,
                "role": who.role.value,
                "coordinated_accounts": sorted(who.coordinated_accounts),
            }
        )

    def report(self, request: Request) -> Response:
        name = request.path_params["name"]
        return json_response(self.report_document(self.identity(request), name, request.query_params))

    def report_document(self, who: Identity, name: str, q: Mapping[str, str]) -> dict[str, Any]:
        """Report NAME (a spec of the catalog or a view) for WHO with the query parameters Q: the
        document `/v1/reports/NAME` sends and the pages show."""
        from slurmtel.commands.view_catalog import VIEWS

        if name in VIEWS:
            return self.view_document(who, VIEWS[name], q)
        spec = REPORTS.get(name)
        if spec is None:
            names = ", ".join([*REPORTS, *VIEWS])
            raise ApiError(HTTPStatus.NOT_FOUND, f"no report '{name}' (reports: {names})")
        known = {
            "start",
            "end",
            "accounts",
            "users",
            "partitions",
            "clusters",
            *(p.name for p in spec.parameters),
        }
        unknown = sorted(set(q.keys()) - known)
        if unknown:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"report {name} takes no parameter {', '.join(unknown)}")
        now = self.clock()
        start, end = self._window(q.get("start"), q.get("end"), now)
        wanted = JobFilter(
            accounts=_split(q.get("accounts")),
            users=_split(q.get("users")),
            partitions=_split(q.get("partitions")),
            clusters=_split(q.get("clusters")),
        )
        query = build_query(
            spec,
            who,
            start=start,
            end=end,
            now=now,
            zone=self.config.zone,
            job_filter=wanted,
            options={p.name: q[p.name] for p in spec.parameters if p.name in q},
            resubmission_window_seconds=self.config.attribution.resubmission_window_seconds,
            poll_interval_seconds=self.config.sources.slurmctld.interval_seconds,
        )
        with self.transaction(query.scope) as conn:
            # what the CLI warns of on the head, in the same scope (slurmtel.commands.common)
            warnings = unknown_filter_warnings(conn, query.scope, wanted)
            result = run_report(conn, spec, query)
        return {**report_document(result), "warnings": warnings}

    def view_document(self, who: Identity, view: View, q: Mapping[str, str]) -> dict[str, Any]:
        """A report that is not a spec (cost, budget, fabric, ...): the document its CLI prints,
        computed by the same function in a transaction scoped to the caller."""
        known = {
            *(("start", "end") if view.window else ()),
            *view.filters,
            *(p.name for p in view.parameters),
        }
        # the login-node client sends every filter, empty where not given
        unknown = sorted(k for k in set(q.keys()) - known if q.get(k))
        if unknown:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, f"report {view.name} takes no parameter {', '.join(unknown)}"
            )
        view_request = view.request(
            who,
            self.clock(),
            start=q.get("start") or None,
            end=q.get("end") or None,
            job_filter=JobFilter(**{kind: _split(q.get(kind)) for kind in view.filters}),
            options={p.name: q[p.name] for p in view.parameters if q.get(p.name)},
        )
        return view.build(self.config, view_request, self.transaction)

    def job(self, request: Request) -> Response:
        query = self._job_query(request)
        return json_response(self.job_document(query))

    def job_document(self, query: Any) -> list[dict[str, Any]]:
        """Every attempt of the job (slurmtel.reports.researcher.job_document), or 404 "not
        found or not yours" (the same for a job outside the caller's scope)."""
        from slurmtel.reports.researcher import job_document

        with self.job_transaction(query.scope) as conn:
            document = job_document(conn, query)
        if not document:
            raise ApiError(HTTPStatus.NOT_FOUND, f"job {query.jobid} not found or not yours")
        return document

    def job_timeline(self, request: Request) -> Response:
        query = self._job_query(request)
        given = request.query_params.get("points")
        points = None if not given else self._positive(given, "points")
        return json_response(self.timeline_document(query, points))

    def timeline_document(self, query: Any, points: int | None = None) -> dict[str, Any]:
        """The job's per-GPU windows (at most POINTS per GPU) and hardware events
        (researcher.job_timeline), or 404."""
        from slurmtel.reports.researcher import job_timeline

        with self.job_transaction(query.scope) as conn:
            document = job_timeline(conn, query, points=points)
        if document is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"job {query.jobid} not found or not yours")
        return document

    def job_page_documents(self, query: Any, points: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """job_document and timeline_document(POINTS) read in one transaction (the job page)."""
        from slurmtel.reports.researcher import job_page_documents

        with self.job_transaction(query.scope) as conn:
            found = job_page_documents(conn, query, points)
        if found is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"job {query.jobid} not found or not yours")
        return found

    def job_plot(self, request: Request) -> Response:
        from slurmtel.reports.researcher import job_plot

        fmt = request.path_params["fmt"]
        if fmt not in PLOT_TYPES:
            raise ApiError(HTTPStatus.NOT_FOUND, f"plots are {', '.join(PLOT_TYPES)}, not {fmt}")
        query = self._job_query(request)
        with self.job_transaction(query.scope) as conn:
            plot = job_plot(conn, query, fmt)
        if plot is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"job {query.jobid} not found or not yours")
        data, has_points = plot
        return Response(
            data, media_type=PLOT_TYPES[fmt], headers={"X-Slurmtel-Plot-Empty": str(not has_points).lower()}
        )

    def _job_query(self, request: Request) -> Any:
        return self.job_query(
            self.identity(request),
            request.path_params["job_id"],
            _split(request.query_params.get("clusters")),
        )

    def job_query(self, who: Identity, jobid: str, clusters: tuple[str, ...] = ()) -> Any:
        """What WHO may ask of JOBID (400 for a malformed id, AccessDenied without the right)."""
        from slurmtel.commands.argtypes import check_job_id
        from slurmtel.reports.researcher import job_query
        from slurmtel.store.samples import sample_store

        try:
            check_job_id(jobid)
        except (ConfigError, ValueError) as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        return job_query(
            who,
            jobid,
            clusters=check_names(clusters, "clusters"),
            now=self.clock(),
            zone=self.config.zone,
            pricing=self.config.chargeback,
            samples=sample_store(self.config),
            causes=self.config.idle_causes,
        )

    def me(self, request: Request) -> Response:
        return json_response(self.me_document(self.identity(request), request.query_params))

    def me_document(self, who: Identity, q: Mapping[str, str]) -> dict[str, Any]:
        """WHO's month (`/v1/me`): researcher.me_document with the CLI's warnings."""
        from slurmtel.reports.researcher import me_document, me_query

        query = me_query(
            who,
            user=q.get("user") or None,
            month=q.get("month") or None,
            now=self.clock(),
            zone=self.config.zone,
            jobs=q.get("jobs") in ("1", "true", "yes"),
            top=self._positive(q.get("top", "10"), "top"),
            pricing=self.config.chargeback,
        )
        with self.transaction(query.scope) as conn:
            warnings = (
                unknown_filter_warnings(conn, query.scope, JobFilter(users=(query.user,)))
                if q.get("user")
                else []
            )
            document = me_document(conn, query)
        return {**document, "warnings": warnings}

    def actions(self, request: Request) -> Response:
        """The record of messages and actions (`slurmtel act log`), in the caller's scope."""
        from slurmtel.store.actions import action_log

        who = self.identity(request)
        scope = self.scope(who, Action.VIEW_ACTIONS)
        q = request.query_params
        unknown = sorted(set(q.keys()) - {"start", "end", "user", "job", "rule", "limit"})
        if unknown:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"actions takes no parameter {', '.join(unknown)}")
        now = self.clock()
        start, end = self._window(q.get("start") or "now-30days", q.get("end"), now)
        limit = self._positive(q.get("limit", "100"), "limit")
        until = end if q.get("end") else None
        with self.transaction(scope) as conn:
            rows = action_log(
                conn,
                scope=scope,
                since=start,
                until=until,
                user=q.get("user") or None,
                job_id=q.get("job") or None,
                rule=q.get("rule") or None,
                limit=limit,
            )
        return json_response(rows)

    def statement(self, request: Request) -> Response:
        return self._statement(request, close=False)

    def close(self, request: Request) -> Response:
        return self._statement(request, close=True)

    def _statement(self, request: Request, *, close: bool) -> Response:
        fmt = request.query_params.get("format", "csv")
        exported = self.statement_export(
            self.identity(request), request.path_params["month"], fmt, close=close
        )
        media = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
        # what the CLI says on stderr beside the statement; percent-encoded (headers are latin-1)
        headers = {f"X-Slurmtel-Notice-{i}": quote(n) for i, n in enumerate(exported.notices)}
        status = HTTPStatus.CONFLICT if exported.refused else HTTPStatus.OK
        return Response(exported.data, status_code=status, media_type=media, headers=headers)

    def statement_export(
        self, who: Identity, month: str, fmt: str, *, close: bool = False, reason: str = ""
    ) -> Any:
        """MONTH's statement as FMT (csv, json) bytes for WHO, closed first with CLOSE
        (slurmtel.chargeback.export.export_statement, as `slurmtel chargeback` writes it)."""
        from slurmtel.chargeback.export import export_statement

        scope = self.scope(who, Action.CLOSE_STATEMENTS if close else Action.VIEW_STATEMENTS)
        if fmt not in ("csv", "json"):
            raise ApiError(HTTPStatus.BAD_REQUEST, f"format must be csv or json, not {fmt}")
        return export_statement(
            self.statements_engine,
            self.config,
            month,
            self.clock(),
            scope=scope,
            fmt=fmt,
            close=close,
            closed_by=who.user,
            reason=reason,
        )

    # --- helpers

    def _window(self, start: str | None, end: str | None, now: datetime) -> tuple[datetime, datetime]:
        try:
            return report_window(start, end, now=now, zone=self.config.zone)
        except ValueError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from None

    @staticmethod
    def _positive(value: str, name: str) -> int:
        # the CLI's bound (slurmtel.bounds): ConfigError, a 400 with its reason
        return parse_count(value, name)


# errors a flood could repeat are logged once a minute per kind and endpoint
_LIMITER = EveryInterval()


def _guarded(endpoint: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """Errors as JSON with their status; the reason is said, internals are not."""

    def handle(request: Request) -> Response:
        try:
            return endpoint(request)
        except ApiError as exc:
            headers = {"WWW-Authenticate": "MUNGE"} if exc.status == HTTPStatus.UNAUTHORIZED else None
            return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)
        except AccessDenied as exc:
            return JSONResponse({"error": str(exc)}, status_code=HTTPStatus.FORBIDDEN)
        except (ConfigError, ChargebackError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=HTTPStatus.BAD_REQUEST)
        except SlurmtelError as exc:
            log_limited(
                _LIMITER, log, f"{exc.kind}:{request.url.path}", f"{request.method} {request.url.path}: {exc}"
            )
            return JSONResponse({"error": f"{exc.kind}: {exc}"}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        except OperationalError as exc:
            log_limited(
                _LIMITER,
                log,
                "database",
                f"{request.method} {request.url.path}: database unavailable: {exc.orig}",
            )
            return JSONResponse({"error": "database unavailable"}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        except Exception as exc:
            # a bug: one line per interval (never the request's values or SQL), the traceback
            # at DEBUG for a bug report; the caller learns nothing of the internals
            log_limited(
                _LIMITER,
                log,
                f"bug:{type(exc).__name__}:{request.url.path}",
                f"{request.method} {request.url.path} failed: {type(exc).__name__} (a bug; DEBUG logs the traceback)",
            )
            log.debug("%s %s failed", request.method, request.url.path, exc_info=True)
            return JSONResponse({"error": "internal error"}, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)

    return handle


def build_app(api: ReadApi, state: ListenerState | None = None, pages: Sequence[BaseRoute] = ()) -> Starlette:
    """API's endpoints routed, with /healthz, /metrics (the listener's own counts) and the
    OpenAPI document (made once); requests in flight bounded (slurmtel.api.limits). STATE: the
    listener's counts and limits (by default from [api]); serve gives it to uvicorn too. PAGES:
    the HTML pages' routes (slurmtel.pages.app.Pages.routes, which serve adds), under the same
    limits."""
    from prometheus_client.exposition import choose_encoder

    from slurmtel.api.limits import ApiLimits, InFlightLimit, listener_registry, startup_hook
    from slurmtel.api.openapi import openapi_document

    spec_document = openapi_document()
    state = state or ListenerState(ApiLimits.from_config(api.config.api))
    registry = listener_registry(state)

    def healthz(request: Request) -> Response:
        return Response(b"ok\n", media_type="text/plain")

    def openapi(request: Request) -> Response:
        return json_response(spec_document)

    def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    routes = [
        Route("/healthz", healthz),
        Route("/metrics", metrics),
        Route("/v1/openapi.json", openapi),
        Route("/v1/whoami", _guarded(api.whoami)),
        Route("/v1/reports/{name}", _guarded(api.report)),
        Route("/v1/jobs/{job_id}", _guarded(api.job)),
        Route("/v1/jobs/{job_id}/plot.{fmt}", _guarded(api.job_plot)),
        Route("/v1/jobs/{job_id}/timeline", _guarded(api.job_timeline)),
        Route("/v1/me", _guarded(api.me)),
        Route("/v1/actions", _guarded(api.actions)),
        Route("/v1/chargeback/{month}", _guarded(api.statement)),
        Route("/v1/chargeback/{month}/close", _guarded(api.close), methods=["POST"]),
        *pages,
    ]
    app = Starlette(
        routes=routes, middleware=[Middleware(InFlightLimit, state=state)], lifespan=startup_hook(state)
    )
    app.state.listener = state
    return app
