"""`slurmtel serve` against a real munged and the real PostgreSQL roles (row-level security).

The server runs on loopback (uvicorn in a thread) with the reader role of migration 0010; the
callers are throwaway unix users (useradd) whose MUNGE credentials come from the real `munge`
run as them (runuser), and root (an admin). The data is the admin day of tests/factories.py with
alice, bob and carol renamed to three of those users, so that a uid maps to a user with jobs.

- the authorisation matrix: every endpoint x {user, coordinator, finance, admin, nobody} and
  x {no credential, expired, replayed, forged, another site's key}: the status each must get,
  and zero rows of another user in any answer;
- the login-node CLI: `slurmtel me`, `job`, `report` and `chargeback` run as two different unix
  users with a config holding only [api], and print exactly what the CLI with the database
  prints for that user;
- the OpenAPI document lists every report and every path it names is served.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, create_engine

from slurmtel.access import Identity, Role
from slurmtel.api.app import ReadApi, build_app
from slurmtel.auth.identity import AuthSettings
from slurmtel.auth.replay import ReplayCache
from slurmtel.cli import main
from slurmtel.config import Config, config_from_dict
from slurmtel.reports.catalog import REPORTS
from slurmtel.store.rls import scope_sessions_to_everything
from tests import munge_lab
from tests.conftest import LoginRoles
from tests.factories import admin_day, at, load_admin_day

NOW = at("2026-11-02T06:00:00")
WINDOW = {"start": "2026-11-01T00:00:00", "end": "2026-11-02T00:00:00"}
COSTS = {
    "compute_per_month": "2400",
    "network_per_month": "150",
    "storage_per_month": "300",
    "support_per_month": "90",
    "operations_per_month": "60",
}


@dataclasses.dataclass(frozen=True)
class People:
    researcher: str  # alice's jobs (physics)
    coordinator: str  # bob's jobs (chem); coordinates bio (carol's account)
    other: str  # carol's jobs (bio)
    finance: str
    nobody: str  # no jobs, no role

    def all(self) -> list[str]:
        return [self.researcher, self.coordinator, self.other, self.finance, self.nobody]


@pytest.fixture(scope="module")
def site() -> Iterator[munge_lab.Munged]:
    munge_lab.ensure_munge()
    with munge_lab.running() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def other_site(site: munge_lab.Munged) -> Iterator[munge_lab.Munged]:
    with munge_lab.running() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def people(site: munge_lab.Munged) -> Iterator[People]:
    munge_lab.require_root("credentials of other users")
    names = [munge_lab.add_user("stapi") for _ in range(5)]
    yield People(*names)
    for name in names:
        munge_lab.remove_user(name)


def api_config(site: munge_lab.Munged, people: People, database_url: str = "") -> Config:
    return config_from_dict(
        {
            "database": {"url": database_url},
            "site": {"timezone": "UTC", "clock": NOW.isoformat()},
            "access": {"finance": [people.finance], "admins": []},
            "api": {"munge_socket": site.socket, "credential_ttl_seconds": 60},
            "cost": COSTS,
            "chargeback": {
                "rates": [{"price_per_gpu_hour": "2.00", "valid_from": "2026-01-01"}],
                "budgets": [
                    {"account": "bio", "period": "month", "gpu_hours": "10"},
                    {"account": "chem", "period": "month", "amount": "50"},
                ],
            },
        }
    )


def load_data(engine: Engine, config: Config, people: People) -> None:
    rename = {"alice": people.researcher, "bob": people.coordinator, "carol": people.other}
    day = admin_day()
    day.attempts = [dataclasses.replace(a, user=rename.get(a.user, a.user)) for a in day.attempts]
    load_admin_day(engine, config, day)
    # the record of [actions]: a warning about each of the three users' jobs, a node alert
    from sqlalchemy import text

    with engine.begin() as conn:
        for job, user, account in (
            ("101", people.researcher, "physics"),
            ("102", people.coordinator, "chem"),
            ("103", people.other, "bio"),
            ("", "", ""),
        ):
            conn.execute(
                text(
                    "INSERT INTO action_log (rule, rule_kind, subject, step, kind, job_id, user_name, account, "
                    "node, decided_at, decided_by, reason, status) VALUES ('idle-gpus', 'gpus_idle', :subject, "
                    "'warning', 'message', :job, :user, :account, :node, :at, 'test', 'why', 'sent')"
                ),
                {
                    "subject": f"job:lab:{job}" if job else "node:lab:gpu01",
                    "job": job,
                    "user": user,
                    "account": account,
                    "node": "" if job else "gpu01",
                    "at": NOW - timedelta(days=1),
                },
            )


class Server:
    """The read API on a free loopback port, in a thread; CLOCK can be moved by a test."""

    def __init__(
        self,
        config: Config,
        engine: Engine,
        people: People,
        statements: Engine | None = None,
        settings: AuthSettings | None = None,
    ) -> None:
        self.now = NOW
        settings = settings or AuthSettings(
            methods=("munge",),
            access=config.access,
            munge_socket=config.api.munge_socket,
            credential_ttl_seconds=60,
            replay_cache=ReplayCache(),
            coordinators=lambda user: frozenset({"bio"}) if user == people.coordinator else frozenset(),
        )
        # the data's now is NOW (site.clock); credentials are checked against the wall clock
        app = build_app(ReadApi(config, engine, settings, lambda: NOW, statements, auth_clock=self._clock))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None, proxy_headers=False)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.skew = timedelta(0)

    def _clock(self) -> datetime:
        return datetime.now(UTC) + self.skew

    def __enter__(self) -> Server:
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise AssertionError("uvicorn did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def served(
    engine: Engine, login_roles: LoginRoles, site: munge_lab.Munged, people: People
) -> Iterator[tuple[Server, Config]]:
    config = api_config(site, people)
    load_data(engine, config, people)
    reader = login_roles.reader_engine()
    statements = scope_sessions_to_everything(create_engine(login_roles.url(login_roles.writer)))
    # the reports' now is NOW: the app's clock is for credentials, site.clock for the data
    with Server(config, reader, people, statements) as server:
        yield server, config
    reader.dispose()
    statements.dispose()


def call(
    server: Server,
    site: munge_lab.Munged,
    path: str,
    *,
    user: str | None,
    method: str = "GET",
    query: dict[str, str] | None = None,
    credential: str | None = None,
    send_credential: bool = True,
) -> tuple[int, bytes]:
    """METHOD PATH?QUERY as USER (None: root), with a credential from SITE bound to it."""
    target = path + ("?" + urllib.parse.urlencode(query) if query else "")
    if send_credential and credential is None:
        credential = site.credential(f"{method} {target} {os.urandom(16).hex()}", user=user)
    headers = {"Authorization": f"MUNGE {credential}"} if send_credential else {}
    url = server.url + target
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --- the matrix --------------------------------------------------------------------------------

OPERATIONS = {"taxonomy", "nodes", "capacity", "fabric", "fabric_nodes", "nodes_drift"}


def endpoints(people: People) -> list[tuple[str, str, dict[str, str]]]:
    """(label, path, query) of every GET endpoint with data behind it."""
    found = [(f"report {name}", f"/v1/reports/{name}", dict(WINDOW)) for name in REPORTS]
    # the reports that are not specs: the same endpoint, the same rules
    found += [
        ("report cost", "/v1/reports/cost", {**WINDOW, "by": "account"}),
        ("report budget", "/v1/reports/budget", {"at": "2026-11-01T12:00:00"}),
        ("report fabric", "/v1/reports/fabric", dict(WINDOW)),
        ("report fabric_nodes", "/v1/reports/fabric_nodes", dict(WINDOW)),
        ("report nodes_drift", "/v1/reports/nodes_drift", {}),
    ]
    found += [
        ("own job", "/v1/jobs/101", {}),
        ("coordinated job", "/v1/jobs/103", {}),
        ("plot", "/v1/jobs/101/plot.png", {}),
        ("timeline", "/v1/jobs/101/timeline", {}),
        ("me", "/v1/me", {"month": "2026-11"}),
        ("me --jobs", "/v1/me", {"month": "2026-11", "jobs": "1"}),
        ("actions", "/v1/actions", {}),
        ("statement", "/v1/chargeback/2026-10", {}),
        ("whoami", "/v1/whoami", {}),
    ]
    return found


def expected_status(label: str, who: str, people: People) -> int:
    role = {
        people.researcher: "user",
        people.coordinator: "coordinator",
        people.finance: "finance",
        people.nobody: "nobody",
        "root": "admin",
    }[who]
    if label == "whoami":
        return 200
    if label.startswith("report "):
        if label.removeprefix("report ") in OPERATIONS:
            return 200 if role == "admin" else 403
        if label == "report cost":
            return 200 if role in ("finance", "admin") else 403
        return 200
    if label == "statement":
        return 200 if role in ("finance", "admin") else 403
    if label == "actions":
        return 403 if role == "finance" else 200
    if role == "finance":
        return 403  # finance sees statements and aggregates, no single job
    if label in ("own job", "plot", "timeline"):
        return 200 if role in ("user", "admin") else 404
    if label == "coordinated job":
        return 200 if role in ("coordinator", "admin") else 404
    return 200  # me


def rows_of(body: bytes) -> list[dict[str, Any]]:
    document = json.loads(body)
    if isinstance(document, list):
        return document
    if "sections" in document:
        return [r for s in document["sections"] for r in s["rows"]]
    return [*document.get("jobs", []), *document.get("top_jobs", [])]


@pytest.mark.timeout(900)
def test_every_endpoint_answers_each_identity_as_allowed_decides(
    served: tuple[Server, Config], site: munge_lab.Munged, people: People
) -> None:
    server, _ = served
    others = {people.coordinator, people.other}
    seen: dict[str, int] = {}
    for label, path, query in endpoints(people):
        for who in (people.researcher, people.coordinator, people.finance, people.nobody, "root"):
            status, body = call(server, site, path, user=None if who == "root" else who, query=query)
            want = expected_status(label, who, people)
            assert status == want, f"{label} as {who}: {status} {body[:300]!r}"
            if status != 200:
                assert json.loads(body)["error"], f"{label} as {who}: a denial says why"
                continue
            if label == "timeline":
                # the windows of the job's GPUs: the job's own, with its events
                assert json.loads(body)["job_id"] == "101", f"{label} as {who}"
                continue
            if label in ("plot", "statement", "whoami"):
                continue
            rows = rows_of(body)
            seen[label] = max(seen.get(label, 0), len(rows))
            users = {r.get("user") for r in rows if r.get("user")}
            if who == people.researcher:
                # zero rows of anyone else: users, and single jobs of other users' accounts
                assert not users & others, f"{label} as {who} shows {users & others}"
                assert users <= {people.researcher}, f"{label} as {who}: {users}"
            if who == people.nobody:
                assert rows == [] or all(r.get("user") in (None, people.nobody) for r in rows), label
            if who == people.coordinator:
                assert users <= {people.coordinator, people.other}, f"{label} as {who}: {users}"
    # the matrix ran over data: the admin saw rows in the reports with attempts behind them
    assert seen["report usage"] > 0 and seen["report failures"] > 0 and seen["own job"] > 0
    # the admin saw the node alert and the three warnings; no one else the node alert
    assert seen["actions"] == 4


@pytest.mark.timeout(600)
def test_bad_credentials_are_refused_on_every_endpoint(
    served: tuple[Server, Config], site: munge_lab.Munged, other_site: munge_lab.Munged, people: People
) -> None:
    server, _ = served
    for label, path, query in [*endpoints(people), ("close", "/v1/chargeback/2026-10/close", {})]:
        method = "POST" if label == "close" else "GET"
        user = people.researcher
        wrong_path = site.credential(f"{method} /v1/elsewhere {os.urandom(16).hex()}", user=user)
        cases = {
            "no credential": dict(daemon=site, send_credential=False),
            "forged": dict(daemon=site, credential="MUNGE:AAAAforged:"),
            "another site's key": dict(daemon=other_site),
            "bound to another path": dict(daemon=site, credential=wrong_path),
        }
        for case, how in cases.items():
            daemon = how.pop("daemon")
            status, body = call(server, daemon, path, user=user, method=method, query=query, **how)  # type: ignore[arg-type]
            assert status == 401, f"{label}, {case}: {status} {body[:200]!r}"
            assert json.loads(body)["error"]
        # replayed: the same credential twice, the second is refused
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        credential = site.credential(f"{method} {target} {os.urandom(16).hex()}", user=None)
        first, _ = call(server, site, path, user=None, method=method, query=query, credential=credential)
        second, body = call(server, site, path, user=None, method=method, query=query, credential=credential)
        assert first != 401 and second == 401, f"{label}, replayed: {first} then {second}"
        assert "replay" in json.loads(body)["error"].lower()
    # expired: the server's clock past the credential's age limit
    credential = site.credential(f"GET /v1/whoami {os.urandom(16).hex()}", user=people.researcher)
    server.skew = timedelta(seconds=600)
    try:
        status, body = call(server, site, "/v1/whoami", user=people.researcher, credential=credential)
    finally:
        server.skew = timedelta(0)
    assert status == 401, body


def test_finance_closes_a_month_once(
    served: tuple[Server, Config], site: munge_lab.Munged, people: People, engine: Engine
) -> None:
    server, _ = served
    status, body = call(server, site, "/v1/chargeback/2026-10/close", user=people.researcher, method="POST")
    assert status == 403, body
    # October has no usage yet: closing it is refused (only `chargeback --close --force` on the head)
    status, body = call(server, site, "/v1/chargeback/2026-10/close", user=people.finance, method="POST")
    assert status == 400 and b"2026-10 has no usage" in body, body
    from slurmtel.store.jobs import write_attempts
    from tests.factories import attempt

    october = at("2026-10-20T08:00:00")
    with engine.begin() as conn:
        write_attempts(
            conn,
            [
                attempt(
                    job_id_raw=990, submit_at=october, start_at=october, end_at=october + timedelta(hours=1)
                )
            ],
        )
    status, closed = call(server, site, "/v1/chargeback/2026-10/close", user=people.finance, method="POST")
    assert status == 200, closed
    again, _ = call(server, site, "/v1/chargeback/2026-10/close", user=people.finance, method="POST")
    assert again == 409
    status, exported = call(server, site, "/v1/chargeback/2026-10", user=people.finance)
    assert status == 200 and exported == closed  # the stored bytes, unchanged


def test_the_openapi_document_names_every_report_and_each_path_is_served(
    served: tuple[Server, Config], site: munge_lab.Munged
) -> None:
    server, _ = served
    with urllib.request.urlopen(server.url + "/v1/openapi.json", timeout=60) as response:
        document = json.loads(response.read())
    paths = document["paths"]
    assert {f"/v1/reports/{name}" for name in REPORTS} <= set(paths)
    for name, spec in REPORTS.items():
        names = {p["name"] for p in paths[f"/v1/reports/{name}"]["get"]["parameters"]}
        assert {p.name for p in spec.parameters} <= names
    for path, operations in paths.items():
        concrete = path.replace("{name}", "usage").replace("{job_id}", "101").replace("{fmt}", "png")
        concrete = concrete.replace("{month}", "2026-10")
        for method in operations:
            status, _ = call(server, site, concrete, user=None, method=method.upper(), send_credential=False)
            assert status == 401, f"{method} {path}: {status} (served, and refused without a credential)"


# --- the login-node CLI ------------------------------------------------------------------------


def interpreter_for(user: str) -> list[str]:
    """A python USER can run that imports this checkout and its packages: this one, or the
    system's of the same version over this venv's site-packages (a venv made from a python under
    /root is not reachable by other users)."""
    root = Path(__file__).resolve().parents[1]
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    env = ["env", f"PYTHONPATH={root}:{site_packages}", "HOME=/tmp"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(f"python{version}") or "", "/usr/bin/python3"):
        if not candidate:
            continue
        check = subprocess.run(
            [
                "runuser",
                "-u",
                user,
                "--",
                *env,
                candidate,
                "-c",
                "import slurmtel.cli, starlette, sqlalchemy",
            ],
            capture_output=True,
            timeout=120,
        )
        if check.returncode == 0:
            return [*env, candidate]
    raise AssertionError(f"no python that {user} may run imports slurmtel")


def run_as(user: str, client_config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "runuser",
            "-u",
            user,
            "--",
            *interpreter_for(user),
            "-m",
            "slurmtel",
            "--config",
            str(client_config),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )


def local_output(
    config: Config, identity: Identity, monkeypatch: pytest.MonkeyPatch, *argv: str
) -> tuple[int, str, str]:
    """What the CLI with the database prints for IDENTITY."""
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: identity)
    monkeypatch.setattr("slurmtel.cli.load_config", lambda path=None: config)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code = main(["--log-level", "WARNING", *argv])
    monkeypatch.undo()
    return code, out.getvalue(), err.getvalue()


@pytest.mark.timeout(900)
def test_researchers_on_a_login_node_see_what_the_database_shows_them(
    served: tuple[Server, Config],
    site: munge_lab.Munged,
    people: People,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = served
    folder = Path(tempfile.mkdtemp(prefix="slurmtel-client-"))
    folder.chmod(0o755)
    try:
        client = folder / "client.toml"
        client.write_text(f'[api]\nurl = "{server.url}"\nmunge_socket = "{site.socket}"\n')
        client.chmod(0o644)
        head = api_config(site, people, database_url)
        views = [
            ("me",),
            ("me", "--jobs", "--format", "csv"),
            ("job", "101"),
            ("job", "101", "--format", "json"),
            ("report", "usage", "-S", WINDOW["start"], "-E", WINDOW["end"], "--format", "csv"),
            ("report", "failures", "-S", WINDOW["start"], "-E", WINDOW["end"]),
            ("report", "retries", "-S", WINDOW["start"], "-E", WINDOW["end"], "--format", "json"),
        ]
        for user in (people.researcher, people.coordinator):
            identity = Identity(
                user, Role.USER, frozenset({"bio"}) if user == people.coordinator else frozenset()
            )
            for argv in views:
                remote = run_as(user, client, *argv)
                code, out, _ = local_output(head, identity, monkeypatch, *argv)
                assert (remote.returncode, remote.stdout) == (code, out), f"{user}: {argv}\n{remote.stderr}"
        # another user's job: not found, as for a job that does not exist
        remote = run_as(people.coordinator, client, "job", "101")
        assert remote.returncode == 1 and remote.stdout == ""
        assert "job 101 not found" in remote.stderr
        # the client config holds no database and grants nothing: an admin list in it is ignored
        client.write_text(client.read_text() + f'[access]\nadmins = ["{people.researcher}"]\n')
        remote = run_as(
            people.researcher, client, "report", "nodes", "-S", WINDOW["start"], "-E", WINDOW["end"]
        )
        assert remote.returncode != 0 and "may not view operations" in remote.stderr
        # finance downloads a statement through the API: the same bytes as on the head
        finance = Identity(people.finance, Role.FINANCE)
        remote = run_as(people.finance, client, "chargeback", "--month", "2026-10", "--format", "csv")
        code, out, _ = local_output(
            head, finance, monkeypatch, "chargeback", "--month", "2026-10", "--format", "csv"
        )
        assert (remote.returncode, remote.stdout) == (code, out) and list(csv.reader(io.StringIO(out)))
        # and the reports that are not specs: cost and budgets for finance, a coordinator's budget
        for who, identity, argv in (
            (people.finance, finance, ("report", "cost", "-S", WINDOW["start"], "-E", WINDOW["end"])),
            (people.finance, finance, ("report", "cost", "--by", "account", "--format", "json")),
            (people.finance, finance, ("report", "budget", "--at", "2026-11-01T12:00:00", "--format", "csv")),
            (
                people.coordinator,
                Identity(people.coordinator, Role.USER, frozenset({"bio"})),
                ("report", "budget", "--at", "2026-11-01T12:00:00"),
            ),
        ):
            remote = run_as(who, client, *argv)
            code, out, _ = local_output(head, identity, monkeypatch, *argv)
            assert (remote.returncode, remote.stdout) == (code, out), f"{who}: {argv}\n{remote.stderr}"
            assert code == 0 and out.strip()
        remote = run_as(people.researcher, client, "report", "cost")
        assert remote.returncode == 1 and "may not view statements" in remote.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(900)
def test_unknown_filter_values_warn_on_a_login_node_as_on_the_head(
    served: tuple[Server, Config],
    site: munge_lab.Munged,
    people: People,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`-u`/`-A` values the data has never held warn through the API exactly as on the head, in
    the caller's scope: to a researcher, a user who exists but is not theirs to see reads the
    same as one who does not exist."""
    server, _ = served
    folder = Path(tempfile.mkdtemp(prefix="slurmtel-client-"))
    folder.chmod(0o755)
    try:
        client = folder / "client.toml"
        client.write_text(f'[api]\nurl = "{server.url}"\nmunge_socket = "{site.socket}"\n')
        client.chmod(0o644)
        head = api_config(site, people, database_url)
        usage = ("report", "usage", "-S", WINDOW["start"], "-E", WINDOW["end"], "--format", "csv")
        researcher = Identity(people.researcher, Role.USER)
        admin = Identity("root", Role.ADMIN)
        cases = [
            (people.researcher, researcher, (*usage, "-u", "nosuchuser"), "no such user 'nosuchuser' in the data you may see"),
            (people.researcher, researcher, (*usage, "-u", people.other), f"no such user '{people.other}' in the data you may see"),
            (people.researcher, researcher, (*usage, "-A", "nosuchaccount"), "no such account 'nosuchaccount' in the data you may see"),
            ("root", admin, (*usage, "-A", "nosuchaccount"), "no such account 'nosuchaccount' in the data"),
            ("root", admin, ("me", "-u", "nosuchuser", "--format", "json"), "no such user 'nosuchuser' in the data"),
        ]  # fmt: skip
        for user, identity, argv, warning in cases:
            remote = run_as(user, client, *argv)
            code, out, err = local_output(head, identity, monkeypatch, *argv)
            assert f"slurmtel: warning: {warning}\n" == err, (argv, err)
            assert (remote.returncode, remote.stdout, remote.stderr) == (code, out, err), f"{user}: {argv}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the other identity methods, and concurrency -----------------------------------------------


def test_slurm_jwt_and_a_trusted_proxy_identify_callers_through_the_api(
    engine: Engine, login_roles: LoginRoles, site: munge_lab.Munged, people: People
) -> None:
    from slurmtel.auth import jwt, proxy

    config = api_config(site, people)
    load_data(engine, config, people)
    key = os.urandom(32)
    settings = AuthSettings(
        methods=("munge", "jwt", "proxy"),
        access=config.access,
        munge_socket=site.socket,
        jwt_key=key,
        trusted_proxies=proxy.parse_networks(["127.0.0.1/32"]),
        replay_cache=ReplayCache(),
    )
    reader = login_roles.reader_engine()
    with Server(config, reader, people, settings=settings) as server:

        def get(path: str, headers: dict[str, str]) -> tuple[int, Any]:
            request = urllib.request.Request(server.url + path, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        token = jwt.make_token(key, people.researcher, datetime.now(UTC), 600)
        status, body = get("/v1/me?month=2026-11", {"X-SLURM-USER-TOKEN": token})
        assert status == 200 and body["user"] == people.researcher and body["summary"]["jobs"] > 0
        # a token of the researcher cannot read the coordinator's job
        status, body = get("/v1/jobs/102", {"X-SLURM-USER-TOKEN": token})
        assert status == 404 and "not found or not yours" in body["error"]
        forged = jwt.make_token(os.urandom(32), people.researcher, datetime.now(UTC), 600)
        assert get("/v1/whoami", {"X-SLURM-USER-TOKEN": forged})[0] == 401
        expired = jwt.make_token(key, people.researcher, datetime.now(UTC) - timedelta(hours=2), 600)
        assert get("/v1/whoami", {"X-SLURM-USER-TOKEN": expired})[0] == 401
        # the proxy's header, from the trusted address (loopback here)
        status, body = get("/v1/whoami", {"X-Remote-User": people.coordinator})
        assert status == 200 and body["user"] == people.coordinator
        # X-Forwarded-For does not make a request come from elsewhere, nor from the proxy
        status, body = get("/v1/whoami", {"X-Forwarded-For": "10.9.9.9"})
        assert status == 401
    reader.dispose()


def test_concurrent_callers_each_get_their_own_rows(
    served: tuple[Server, Config], site: munge_lab.Munged, people: People
) -> None:
    """Bounded: 60 requests from 6 threads, two users interleaved on one connection pool: each
    answer holds its caller's rows only (the scope is per transaction, never left behind)."""
    from concurrent.futures import ThreadPoolExecutor

    server, _ = served
    plan = [people.researcher, people.coordinator] * 30
    credentials = [
        site.credential(f"GET /v1/me?month=2026-11&jobs=1 {os.urandom(16).hex()}", user=u) for u in plan
    ]

    def one(args: tuple[str, str]) -> tuple[str, int, bytes]:
        user, credential = args
        status, body = call(
            server, site, "/v1/me", user=user, credential=credential, query={"month": "2026-11", "jobs": "1"}
        )
        return user, status, body

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, zip(plan, credentials, strict=True)))
    for user, status, body in answers:
        assert status == 200, body
        jobs = json.loads(body)["jobs"]
        assert jobs, f"{user} has jobs"
        owner = {"101": people.researcher, "102": people.coordinator}
        assert {owner.get(j["job_id"], "other") for j in jobs} == {user}


def test_a_jobs_reads_keep_one_plan_per_connection(
    engine: Engine, login_roles: LoginRoles, site: munge_lab.Munged, people: People
) -> None:
    """The job's statements, once psycopg has prepared them on a connection, keep one generic
    plan (planning them cost more than running them); the same answer every time, and the
    setting ends with the job's transaction: the reports that follow are planned per call."""
    from sqlalchemy import text

    from slurmtel.access import EVERYTHING
    from slurmtel.reports.researcher import JobQuery

    config = api_config(site, people)
    load_data(engine, config, people)
    reader = login_roles.reader_engine()
    try:
        api = ReadApi(config, reader, AuthSettings(), lambda: NOW)
        # one connection: the pool gives it back to each read in turn
        documents = [api.job_document(JobQuery("101", (), NOW, UTC, EVERYTHING)) for _ in range(8)]
        assert documents[0] and all(d == documents[0] for d in documents)
        with reader.connect() as conn:
            prepared = conn.execute(
                text("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            ).all()
            after = conn.execute(text("SHOW plan_cache_mode")).scalar_one()
        job_statements = [p for p in prepared if "job_attempt" in p.statement]
        assert job_statements, prepared
        # prepared at the fifth run, planned generically from then on, never per call again
        assert all(p.generic_plans >= 3 and p.custom_plans == 0 for p in job_statements), job_statements
        assert after == "auto"
    finally:
        reader.dispose()


# --- `slurmtel serve` itself, over TLS ------------------------------------------------------


def test_slurmtel_serve_over_tls_answers_the_login_node_cli(
    engine: Engine, database_url: str, site: munge_lab.Munged, people: People, tmp_path: Path
) -> None:
    """The real command (its own process, its config, uvicorn with TLS) and the real client."""
    config = api_config(site, people, database_url)
    load_data(engine, config, people)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    head = tmp_path / "head.toml"
    head.write_text(
        f'[database]\nurl = "{database_url}"\n[site]\ntimezone = "UTC"\nclock = "{NOW.isoformat()}"\n'
        f'[api]\nport = {port}\nmunge_socket = "{site.socket}"\n'
        f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    )
    client = tmp_path / "client.toml"
    client.write_text(f'[api]\nurl = "https://127.0.0.1:{port}"\nmunge_socket = "{site.socket}"\n')
    server = subprocess.Popen(
        [sys.executable, "-m", "slurmtel", "--config", str(head), "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(600):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            time.sleep(0.1)
        cli = [
            sys.executable,
            "-m",
            "slurmtel",
            "--config",
            str(client),
            "me",
            "--month",
            "2026-11",
            "--format",
            "json",
        ]
        trusted = subprocess.run(
            cli, capture_output=True, text=True, timeout=120, env={**os.environ, "SSL_CERT_FILE": str(cert)}
        )
        assert trusted.returncode == 0, trusted.stderr
        assert json.loads(trusted.stdout)["user"] == "root"  # root's uid: an admin, its own month
        # a certificate the client does not trust: no answer, and it says why
        untrusted = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert untrusted.returncode == 1 and "cannot reach slurmtel serve" in untrusted.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    finally:
        server.terminate()
        server.wait(timeout=60)
