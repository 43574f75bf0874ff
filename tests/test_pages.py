"""The pages of `slurmtel serve` (DESIGN §12), against the real server process, the real
PostgreSQL roles (row security), a trusted reverse proxy per person (tests/pages_site.py) and a
real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium).

- over HTTP: the authorisation matrix over every page x {researcher, coordinator, finance,
  admin, nobody, no proxy}: the status allowed() decides, the same not-found page for another
  user's job as for a missing one, no other user's rows; the forms that change statements
  refuse a missing or foreign token and another site's Origin; --dev-user is refused unless
  the server listens on loopback;
- in the browser: as each person, the figures on the page equal what the CLI prints as JSON
  for the same identity (`slurmtel job`, `me`, `report`, `chargeback`); every hostile job name
  renders as text (no element, no script ran); a statement downloaded from its page has the
  CLI's bytes; closing a month through the page's form works and is in the audit trail.

The browser tests fail (never skip) without chromium when CI=true or
SLURMTEL_REQUIRE_BROWSER=1; elsewhere they skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine

from slurmtel.access import Identity
from slurmtel.auth.identity import identity_for
from slurmtel.cli import main
from slurmtel.commands.common import coordinated_accounts
from slurmtel.config import config_from_dict, load_config
from slurmtel.reports.catalog import REPORTS
from slurmtel.reports.render import escape_controls
from tests import pages_site as ps
from tests.conftest import LoginRoles, _empty_tables

BROWSER_REQUIRED = os.environ.get("CI") == "true" or os.environ.get("SLURMTEL_REQUIRE_BROWSER") == "1"


@dataclass
class Site:
    server_url: str
    proxies: dict[str, ps.Proxy]
    cli_config: Path
    tmp: Path

    def url(self, who: str, path: str) -> str:
        return self.proxies[who].url + path


@pytest.fixture(scope="module")
def site(
    _session_engine: Engine,
    login_roles: LoginRoles,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("pages")
    sacctmgr = ps.sacctmgr_script(tmp)
    _empty_tables(_session_engine)
    settings = ps.site_settings(database_url, sacctmgr)
    ps.load_site(_session_engine, config_from_dict(settings))
    cli_config = tmp / "cli.toml"
    cli_config.write_text(ps.to_toml(settings))
    port = ps.free_port()
    config_file = ps.write_serve_config(tmp, login_roles, sacctmgr, port)
    with ps.serve(config_file, log=tmp / "serve.log") as process:
        server_url = f"http://127.0.0.1:{port}"
        ps.wait_for(server_url, process, tmp / "serve.log")
        proxies = {who: ps.Proxy(port, who) for who in ps.PEOPLE}
        proxies[""] = ps.Proxy(port, "")
        try:
            yield Site(server_url, proxies, cli_config, tmp)
        finally:
            for proxy in proxies.values():
                proxy.close()


def identity(site: Site, user: str) -> Identity:
    config = load_config(site.cli_config)
    return identity_for(user, None, config.access, lambda u: coordinated_accounts(config, u))


def cli_json(
    site: Site, who: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> Any:
    """What `slurmtel ARGV` prints (JSON) run by WHO on the head node (the database's own path)."""
    person = identity(site, who)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: person)
    capsys.readouterr()
    code = main(["--config", str(site.cli_config), "--log-level", "WARNING", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def cli_bytes(site: Site, who: str, monkeypatch: pytest.MonkeyPatch, *argv: str) -> bytes:
    person = identity(site, who)
    monkeypatch.setattr("slurmtel.commands.common.current_identity", lambda config: person)
    output = site.tmp / f"out-{time.monotonic_ns()}"
    code = main(["--config", str(site.cli_config), "--log-level", "WARNING", *argv, "--output", str(output)])
    assert code == 0
    return output.read_bytes()


# --- the matrix over the pages -------------------------------------------------------------


def pages() -> list[tuple[str, str]]:
    found = [
        ("own job", "/jobs/105"),
        ("coordinated job", "/jobs/102"),
        ("missing job", "/jobs/999999"),
        ("own job json", "/jobs/105/figures.json"),
        ("own job csv", "/jobs/105/figures.csv"),
        ("own timeline csv", "/jobs/105/timeline.csv"),
        ("me", f"/me?month={ps.MONTH}"),
        ("reports", "/reports"),
        ("finance", "/finance"),
        ("statement", f"/finance/{ps.MONTH}"),
        ("statement csv", f"/finance/{ps.MONTH}/statement.csv"),
        ("statement parquet", f"/finance/{ps.MONTH}/statement.parquet"),
        ("index", "/"),
    ]
    window = "start=2026-11-01T00:00:00&end=2026-11-02T00:00:00"
    found += [(f"report {name}", f"/reports/{name}?{window}") for name in REPORTS]
    found += [("report cost", f"/reports/cost?{window}&by=account"), ("report budget", "/reports/budget")]
    found += [("report idle_now", "/reports/idle_now")]
    return found


OPERATIONS = {"taxonomy", "nodes", "capacity"}


def expected(label: str, who: str) -> int:
    role = {
        ps.RESEARCHER: "user",
        ps.COORDINATOR: "coordinator",
        ps.FINANCE: "finance",
        ps.ADMIN: "admin",
        ps.NOBODY: "nobody",
        "": "anonymous",
    }[who]
    if role == "anonymous":
        return 401
    if label in ("index", "reports"):
        return 200
    if label == "missing job":
        return 403 if role == "finance" else 404
    if label.startswith("report") and label != "reports":
        name = label.removeprefix("report ")
        if name in OPERATIONS:
            return 200 if role == "admin" else 403
        if name == "cost":
            return 200 if role in ("finance", "admin") else 403
        if name == "idle_now":
            return 403 if role == "finance" else 200  # running jobs: job detail
        return 200
    if label.startswith(("finance", "statement")):
        return 200 if role in ("finance", "admin") else 403
    if role == "finance":
        return 403  # finance sees statements and aggregates, no single job
    if label.startswith("own"):
        # erin's job, in physics: alice coordinates physics
        return 200 if role in ("user", "coordinator", "admin") else 404
    if label == "coordinated job":
        return 200 if role in ("coordinator", "admin") else 404
    return 200  # me


@pytest.mark.timeout(900)
def test_every_page_answers_each_person_as_allowed_decides(site: Site) -> None:
    others = {"alice", "bob", "carol", "dave", "frank"}
    for label, path in pages():
        for who in (*ps.PEOPLE, ""):
            status, body, headers = ps.fetch(site.url(who, path))
            want = expected(label, who)
            assert status == want, f"{label} as {who or 'nobody at all'}: {status} {body[:300]!r}"
            if status != 200 or not headers.get("content-type", "").startswith("text/html"):
                continue
            text = body.decode()
            lowered = {k.lower(): v for k, v in headers.items()}
            assert lowered["content-security-policy"].startswith("default-src 'none'"), label
            assert lowered["cache-control"] == "private, no-store", label
            if who == ps.RESEARCHER:
                # the researcher's pages name no one else
                named = {u for u in others if re.search(rf">{u}<", text)}
                assert not named, f"{label} as {who} shows {named}"


def test_another_users_job_is_the_same_page_as_a_missing_job(site: Site) -> None:
    status, theirs, _ = ps.fetch(site.url(ps.RESEARCHER, "/jobs/101"))
    status_missing, missing, _ = ps.fetch(site.url(ps.RESEARCHER, "/jobs/999999"))
    assert status == status_missing == 404
    assert theirs.replace(b"101", b"N") == missing.replace(b"999999", b"N")
    # the coordinator sees bob's job (chemistry), not carol's (bio)
    assert ps.fetch(site.url(ps.COORDINATOR, "/jobs/102"))[0] == 200
    assert ps.fetch(site.url(ps.COORDINATOR, "/jobs/103"))[0] == 404


def test_the_front_page_opens_a_job_by_its_id(site: Site, browser: Any) -> None:
    browser.get(site.url(ps.RESEARCHER, "/"))
    browser.find_element("id", "job-id").send_keys("105")
    browser.find_element("css selector", "form.filters button").click()
    assert wait_for_id(browser, "title").text.startswith("Job 105")
    status, body, _ = ps.fetch(site.url(ps.RESEARCHER, "/jobs?id=../v1/whoami"))
    assert status == 400 and b"not a job id" in body


def test_a_path_that_is_no_page_is_the_not_found_page(site: Site) -> None:
    for path in ("/jobs?id=", "/nothing/here", "/jobs/105/plot", "/finance/2026-11/statement"):
        status, body, _ = ps.fetch(site.url(ps.ADMIN, path))
        assert status == 404 and b'<h1 id="error">Not found</h1>' in body, path
    status, body, _ = ps.fetch(site.url(ps.ADMIN, "/v1/nothing"))
    assert status == 404 and json.loads(body) == {"error": "no endpoint /v1/nothing"}


def test_a_user_header_from_the_client_is_never_believed(site: Site) -> None:
    # the proxy strips what the client sends; straight to the server, the header is from no proxy
    status, _, _ = ps.fetch(site.url("", "/me"), headers={"X-Remote-User": ps.ADMIN})
    assert status == 401
    status, body, _ = ps.fetch(site.server_url + "/me", headers={"X-Remote-User": ps.ADMIN})
    # the server's peer is 127.0.0.1, a trusted proxy here: the test proxy is what strips it
    assert status == 200 and ps.ADMIN.encode() in body


def test_forms_that_change_statements_need_the_callers_token(site: Site) -> None:
    month = "2026-10"  # ended, no usage: a close the guards would refuse anyway
    page = ps.fetch(site.url(ps.FINANCE, f"/finance/{month}"))[1].decode()
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert token, "the statement page of an open month has a close form with a token"
    url = site.url(ps.FINANCE, f"/finance/{month}/close")
    form = "application/x-www-form-urlencoded"
    for data, headers in (
        (b"reason=x", {"Content-Type": form}),
        (b"csrf=" + b"0" * 64, {"Content-Type": form}),
        (f"csrf={token.group(1)}".encode(), {"Content-Type": form, "Origin": "http://evil.example"}),
    ):
        status, body, _ = ps.fetch(url, data=data, headers=headers)
        assert status == 403, body[:300]
    # the admin's token is not finance's
    admin_page = ps.fetch(site.url(ps.ADMIN, f"/finance/{month}"))[1].decode()
    admin_token = re.search(r'name="csrf" value="([0-9a-f]+)"', admin_page)
    assert admin_token and admin_token.group(1) != token.group(1)
    # a researcher may not post at all
    status, _, _ = ps.fetch(
        site.url(ps.RESEARCHER, f"/finance/{month}/close"),
        data=f"csrf={token.group(1)}".encode(),
        headers={"Content-Type": form},
    )
    assert status == 403
    listing = ps.fetch(site.url(ps.FINANCE, "/finance"))[1].decode()
    assert month not in listing, "nothing was closed"


def test_dev_user_is_refused_unless_listening_on_loopback(site: Site) -> None:
    config = site.tmp / "serve.toml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmtel",
            "--config",
            str(config),
            "serve",
            "--dev-user",
            "erin",
            "--listen",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "--dev-user" in result.stderr and "127.0.0.1" in result.stderr


def test_dev_user_serves_the_pages_as_that_user(site: Site) -> None:
    port = ps.free_port()
    with ps.serve(
        site.tmp / "serve.toml", "--dev-user", ps.RESEARCHER, "--port", str(port), log=site.tmp / "dev.log"
    ) as process:
        ps.wait_for(f"http://127.0.0.1:{port}", process, site.tmp / "dev.log")
        status, body, _ = ps.fetch(f"http://127.0.0.1:{port}/jobs/105")
        assert status == 200 and b"erin" in body
        assert ps.fetch(f"http://127.0.0.1:{port}/jobs/101")[0] == 404
    assert "DEVELOPMENT IDENTITY" in (site.tmp / "dev.log").read_text()


# --- in the browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        message = "chromium and chromium-driver (Debian) are not installed"
        if BROWSER_REQUIRED:
            pytest.fail(message + " (CI=true or SLURMTEL_REQUIRE_BROWSER=1: the browser tests must run)")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = site.tmp / "downloads"
    downloads.mkdir()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.downloads = downloads  # type: ignore[attr-defined]
    try:
        yield chrome
    finally:
        chrome.quit()


def by_css(chrome: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return chrome.find_elements(By.CSS_SELECTOR, selector)


def wait_for_id(chrome: Any, element_id: str, seconds: float = 60) -> Any:
    """The element ELEMENT_ID once the page a form was sent from has been replaced by the answer
    (a click on a submit button does not wait for the POST's redirect to load)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(chrome, seconds).until(
        expected_conditions.presence_of_element_located((By.ID, element_id))
    )


def table_cells(chrome: Any, table_id: str) -> tuple[list[str], list[list[str]]]:
    headers = [th.text for th in by_css(chrome, f"#{table_id} thead th")]
    rows = [
        [td.text for td in tr.find_elements("css selector", "td")]
        for tr in by_css(chrome, f"#{table_id} tbody tr")
    ]
    return headers, rows


def shown(column: str, value: Any) -> str:
    """A value as a page shows it (slurmtel.pages.app.Table, the table units of slurmtel.columns)."""
    from slurmtel.columns import decode_value
    from slurmtel.pages.app import Table

    return Table([{column: decode_value(column, value)}], [column], ZoneInfo("UTC")).rows[0][0]


def test_the_job_page_shows_the_clis_figures(site: Site, browser: Any, monkeypatch, capsys) -> None:
    from slurmtel.columns import table_name
    from slurmtel.pages.app import PAGE_GPU_COLUMNS

    for who, job in (
        (ps.RESEARCHER, "105"),
        (ps.COORDINATOR, "101"),
        (ps.COORDINATOR, "102"),
        (ps.ADMIN, "103"),
    ):
        attempts = cli_json(site, who, monkeypatch, capsys, "job", job, "--format", "json")
        browser.get(site.url(who, f"/jobs/{job}"))
        assert browser.find_element("id", "who").text.startswith(who)
        sections = by_css(browser, "section.attempt")
        assert len(sections) == len(attempts), f"job {job}: every attempt"
        for section, r in zip(sections, attempts, strict=True):
            figures = {
                dd.get_attribute("data-figure"): dd.text for dd in section.find_elements("css selector", "dd")
            }
            assert figures["user"] == r["user"] and figures["account"] == r["account"]
            assert figures["partition"] == r["partition"]
            assert figures["nodes"] == ",".join(r["nodes"])
            assert figures["GPUs"].split(" ")[0] == str(r["gpus"])
            # what the attempt's GPU-hours cost at the site's rate (2.00 per GPU-hour here)
            assert figures["GPU cost"].split(" ")[0] == r["gpu_cost_amount"], (job, figures)
            if r["gpu_figures"]:
                headers, rows = table_cells(browser, f"gpus-{r['attempt']}")
                assert headers == [table_name(c) for c in PAGE_GPU_COLUMNS]
                want = [[shown(c, g[c]) for c in PAGE_GPU_COLUMNS] for g in r["gpu_figures"]]
                assert rows == want, f"job {job} attempt {r['attempt']} as {who}"
            page_advice = [li.text for li in section.find_elements("css selector", ".advice li")]
            assert page_advice == r["advice"]
        # the page's own JSON link is the CLI's JSON
        browser.get(site.url(who, f"/jobs/{job}/figures.json"))
        assert json.loads(browser.find_element("tag name", "body").text) == attempts


def test_a_running_jobs_page_says_its_figures_are_so_far(site: Site) -> None:
    status, body, _ = ps.fetch(site.url(ps.RESEARCHER, "/jobs/401"))
    page = body.decode()
    assert status == 200 and "still running: every figure below is so far" in page
    assert page.count('<svg class="timeline') == 2 and "gpu07/1" in page


def test_the_idle_gpu_is_marked_and_drawn(site: Site, browser: Any) -> None:
    browser.get(site.url(ps.COORDINATOR, "/jobs/101"))
    (chart,) = by_css(browser, "svg.timeline")
    # job 101 is idle half the time: not an idle GPU; utilisation and memory drawn (the
    # factory's windows have no power)
    assert "idle" not in chart.get_attribute("class")
    assert len(chart.find_elements("css selector", "path")) == 2
    browser.get(site.url(ps.RESEARCHER, "/jobs/301"))
    (chart,) = by_css(browser, "svg.timeline")
    assert "idle" in chart.get_attribute("class").split()
    assert chart.get_attribute("aria-label") == "gpu03/0 — idle 100 %"
    assert "idle: gpu03/0" in browser.find_element("css selector", "h2 .idle").text


def test_hostile_job_names_render_as_text(site: Site, browser: Any) -> None:
    for job, name in ps.HOSTILE_JOBS.items():
        browser.get(site.url(ps.RESEARCHER, f"/jobs/{job}"))
        title = browser.find_element("id", "job-name").text
        assert title == f"({escape_controls(name)})", job
        # nothing of the name became an element, and no script of it ran
        assert not by_css(browser, "main img, main script, #job-name *")
        assert browser.title == f"Job {job} · slurmtel"
    browser.get(site.url(ps.RESEARCHER, f"/me?month={ps.MONTH}"))
    headers, rows = table_cells(browser, "jobs")
    names = {row[headers.index("name")] for row in rows}
    assert {escape_controls(n) for n in ps.HOSTILE_NAMES} <= names
    assert not by_css(browser, "main img, main script")


def test_another_users_job_is_not_found_in_the_browser(site: Site, browser: Any) -> None:
    browser.get(site.url(ps.RESEARCHER, "/jobs/101"))
    assert browser.find_element("id", "error").text == "Not found"
    assert "not found or not yours" in browser.find_element("id", "message").text


def test_my_month_shows_the_clis_figures(site: Site, browser: Any, monkeypatch, capsys) -> None:
    from slurmtel.columns import table_name
    from slurmtel.reports.researcher import ME_SUMMARY_COLUMNS

    for who in (ps.RESEARCHER, ps.COORDINATOR):
        summary = cli_json(site, who, monkeypatch, capsys, "me", "--month", ps.MONTH, "--format", "json")
        jobs = cli_json(
            site, who, monkeypatch, capsys, "me", "--month", ps.MONTH, "--jobs", "--format", "json"
        )
        browser.get(site.url(who, f"/me?month={ps.MONTH}"))
        figures = {td.get_attribute("data-figure"): td.text for td in by_css(browser, "#summary td")}
        for column in ME_SUMMARY_COLUMNS:
            assert figures[table_name(column)] == shown(column, summary[column]), (who, column)
        headers, rows = table_cells(browser, "jobs")
        assert [r[headers.index("job_id")] for r in rows] == [j["job_id"] for j in jobs]
        assert headers[0] == "flags"
        flags = {r[headers.index("job_id")]: r[0] for r in rows}
        if who == ps.RESEARCHER:
            # 301's GPU was idle all its 5 minutes; 105 was busy
            assert (flags["301"], flags["105"]) == ("idle GPUs", "")
    # the coordinator sees her accounts' usage by user: `report usage --by user` of them
    accounts = ",".join(sorted(identity(site, ps.COORDINATOR).coordinated_accounts))
    usage = cli_json(
        site, ps.COORDINATOR, monkeypatch, capsys, "report", "usage", "--by", "user", "-A", accounts,
        "-S", "2026-11-01T00:00:00", "-E", "2026-12-01T00:00:00", "--format", "json",
    )  # fmt: skip
    headers, rows = table_cells(browser, "accounts-usage")
    assert rows and [r[headers.index("user")] for r in rows] == [u["user"] for u in usage]
    assert [r[headers.index("allocated_gpu_hours")] for r in rows] == [
        shown("allocated_gpu_seconds", u["allocated_gpu_seconds"]) for u in usage
    ]


@pytest.mark.parametrize("name", ["idle", "failures", "queue", "taxonomy", "usage"])
def test_a_report_page_shows_the_clis_report(
    site: Site, browser: Any, monkeypatch, capsys, name: str
) -> None:
    from slurmtel.columns import table_name

    start, end = ps.WINDOW["start"], ps.WINDOW["end"]
    who = ps.ADMIN
    document = cli_json(
        site, who, monkeypatch, capsys, "report", name, "-S", start, "-E", end, "--format", "json"
    )
    browser.get(site.url(who, f"/reports/{name}?start={start}&end={end}"))
    # the CLI's JSON: {section: rows}, or a single-section report's rows
    if isinstance(document, list):
        (table,) = by_css(browser, "table[id^=section-]")
        by_section = {table.get_attribute("id").removeprefix("section-"): document}
    else:
        by_section = document
    for section, rows in by_section.items():
        headers, cells = table_cells(browser, f"section-{section}")
        columns = [c for c in (rows[0] if rows else {}) if table_name(c) in headers]
        assert len(cells) == len(rows), (name, section)
        for row, got in zip(rows, cells, strict=True):
            for c in columns:
                assert got[headers.index(table_name(c))] == shown(c, row[c]), (name, section, c)
    # the form holds the filters
    assert by_css(browser, "form.filters input[name=start]")


def test_a_downloaded_statement_has_the_clis_bytes_and_closing_works(
    site: Site, browser: Any, monkeypatch, capsys
) -> None:
    month = ps.MONTH
    browser.get(site.url(ps.FINANCE, f"/finance/{month}"))
    assert "Open" in browser.find_element("id", "status").text
    browser.find_element("css selector", "#close-form input[name=reason]").send_keys("month end <b>test</b>")
    browser.find_element("css selector", "#close-form button").click()
    assert wait_for_id(browser, "done").text == f"{month} closed."
    assert browser.find_element("id", "csv-sha256").text
    for fmt in ("csv", "json", "parquet"):
        target = browser.downloads / f"slurmtel-{month}.{fmt}"
        browser.find_element("id", f"download-{fmt}").click()
        for _ in range(200):
            if target.exists() and not list(browser.downloads.glob("*.crdownload")):
                break
            time.sleep(0.05)
        downloaded = target.read_bytes()
        expected_bytes = cli_bytes(
            site, ps.FINANCE, monkeypatch, "chargeback", "--month", month, "--format", fmt
        )
        assert downloaded == expected_bytes, fmt
    # the audit trail names who closed it, with the reason shown as text
    browser.get(site.url(ps.FINANCE, "/finance"))
    _, audit = table_cells(browser, "audit")
    assert any(ps.FINANCE in row and "month end <b>test</b>" in row for row in audit), audit
    listing = cli_json(site, ps.FINANCE, monkeypatch, capsys, "chargeback", "--list", "--format", "json")
    _, statements = table_cells(browser, "statements")
    assert [r[1] for r in statements] == [s["month"] for s in listing]
    assert statements[0][8] == listing[0]["csv_sha256"]
    # voided through its form, with the reason kept: the listing says so, as the CLI's does
    browser.get(site.url(ps.FINANCE, f"/finance/{month}"))
    browser.find_element("css selector", "#void-form input[name=reason]").send_keys("wrong rate")
    browser.find_element("css selector", "#void-form button").click()
    assert wait_for_id(browser, "done").text == f"{month} voided."
    assert "Open" in browser.find_element("id", "status").text
    listing = cli_json(site, ps.FINANCE, monkeypatch, capsys, "chargeback", "--list", "--format", "json")
    assert [(s["month"], s["status"], s["reason"]) for s in listing] == [(month, "voided", "wrong rate")]
    browser.get(site.url(ps.FINANCE, "/finance"))
    _, statements = table_cells(browser, "statements")
    assert [(r[1], r[2]) for r in statements] == [(month, "voided")]
    _, audit = table_cells(browser, "audit")
    assert any("void" in " ".join(row) and "wrong rate" in row for row in audit), audit


def test_finance_pages_are_refused_to_researchers_in_the_browser(site: Site, browser: Any) -> None:
    browser.get(site.url(ps.RESEARCHER, "/finance"))
    assert browser.find_element("id", "error").text == "Not allowed"
    assert "Finance" not in [a.text for a in by_css(browser, "header a")]


def test_the_job_page_weighs_less_than_300_kb(site: Site) -> None:
    status, body, _ = ps.fetch(site.url(ps.COORDINATOR, "/jobs/101"))
    assert status == 200
    # the whole page: no other resource is loaded (no script, style sheet, font or image)
    assert len(body) < 300_000
    assert not re.search(rb"<(script|link|img)\b", body)


# --- the Open OnDemand app (config/ondemand/slurmtel/passenger_wsgi.py) ----------------------


def ondemand_app(monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "config" / "ondemand" / "slurmtel" / "passenger_wsgi.py"
    spec = importlib.util.spec_from_file_location("slurmtel_ood_app", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key in ("SLURMTEL_URL", "SLURMTEL_MODE", "SLURMTEL_TOKEN_COMMAND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURMTEL_OOD_ENV", "/nonexistent/env")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return module.application


def call_app(application: Any, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer["status"], answer["headers"] = status, dict(headers)

    environ = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "/pun/sys/slurmtel",
        "PATH_INFO": path,
        "QUERY_STRING": "",
    }
    body = b"".join(application(environ, start_response))
    return answer["status"], answer["headers"], body


def test_the_ondemand_link_of_an_email_redirects_to_the_job_page(monkeypatch: pytest.MonkeyPatch) -> None:
    app = ondemand_app(monkeypatch, SLURMTEL_URL="https://slurmtel.example.org/")
    status, headers, _ = call_app(app, "/12345")
    assert status.startswith("302") and headers["Location"] == "https://slurmtel.example.org/jobs/12345"
    assert call_app(app, "/")[1]["Location"] == "https://slurmtel.example.org/me"
    assert call_app(app, "/123_4")[1]["Location"] == "https://slurmtel.example.org/jobs/123_4"
    # the [actions] messages link to {base_url}/jobs/ID: with base_url at the app, that works too
    assert call_app(app, "/jobs/12345")[1]["Location"] == "https://slurmtel.example.org/jobs/12345"
    for bad in ("/../../etc/passwd", "/12345/../../v1/chargeback/2026-11", "/<script>", "/v1/whoami"):
        assert call_app(app, bad)[0].startswith("400"), bad
    unset = ondemand_app(monkeypatch)
    assert call_app(unset, "/1")[0].startswith("500")


def test_the_ondemand_app_reads_its_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.write_text(
        "# the site's slurmtel\nSLURMTEL_URL='https://slurmtel.example.org'\nSLURMTEL_MODE=redirect\n"
    )
    app = ondemand_app(monkeypatch)
    monkeypatch.setenv("SLURMTEL_OOD_ENV", str(env))
    assert call_app(app, "/7")[1]["Location"] == "https://slurmtel.example.org/jobs/7"
    # the process environment wins over the file
    monkeypatch.setenv("SLURMTEL_URL", "https://other.example.org")
    assert call_app(app, "/7")[1]["Location"] == "https://other.example.org/jobs/7"


def test_the_ondemand_app_proxies_pages_with_the_users_slurm_token(
    site: Site, login_roles: LoginRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxy mode: the PUN asks for the user's Slurm JWT (here a script printing what `scontrol
    token` prints, a token made with the site's key) and fetches the page with it: slurmtel
    believes the token, and the page's links stay under /pun/sys/slurmtel/."""
    from datetime import UTC, datetime

    from slurmtel.auth.jwt import make_token

    key = site.tmp / "jwt.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    port = ps.free_port()
    config = ps.write_serve_config(
        site.tmp, login_roles, str(site.tmp / "sacctmgr"), port, ("jwt",), "jwt.toml", jwt_key_file=str(key)
    )
    token = make_token(key.read_bytes(), ps.RESEARCHER, datetime.now(UTC), 300)
    scontrol = site.tmp / "scontrol-token"
    scontrol.write_text(f"#!/bin/sh\necho SLURM_JWT={token}\n")
    scontrol.chmod(0o755)
    with ps.serve(config, log=site.tmp / "jwt.log") as process:
        ps.wait_for(f"http://127.0.0.1:{port}", process, site.tmp / "jwt.log")
        app = ondemand_app(
            monkeypatch,
            SLURMTEL_URL=f"http://127.0.0.1:{port}",
            SLURMTEL_MODE="proxy",
            SLURMTEL_TOKEN_COMMAND=str(scontrol),
        )
        status, headers, body = call_app(app, "/105")
        assert status.startswith("200") and headers["Content-Type"].startswith("text/html")
        page = body.decode()
        assert "Job 105" in page and 'href="/pun/sys/slurmtel/jobs/105/figures.json"' in page
        assert 'href="/jobs/' not in page
        # the token is erin's: alice's job is not found, as in slurmtel itself
        assert call_app(app, "/101")[0].startswith("404")
        assert call_app(app, "/finance")[0].startswith("403")
        # nothing that changes a statement goes through the PUN
        assert call_app(app, "/finance/2026-11/close", method="POST")[0].startswith("400")
        assert call_app(app, "/finance/2026-11", method="POST")[0].startswith("405")


def test_a_timeline_in_slices_keeps_each_slices_highest_value(site: Site) -> None:
    """The page draws at most TIMELINE_POINTS points per GPU: slices of the attempt, each the
    highest of its windows (job 101: 240 windows of 30 s, half busy at 80 %)."""
    status, body, _ = ps.fetch(site.url(ps.COORDINATOR, "/jobs/101/timeline.json"))
    assert status == 200
    (full,) = json.loads(body)["gpus"]
    assert len(full["points"]) == 240
    status, body, _ = ps.fetch(site.url(ps.COORDINATOR, "/v1/jobs/101/timeline?points=10"))
    assert status == 200
    (sliced,) = json.loads(body)["gpus"]
    assert len(sliced["points"]) == 10
    assert {p["window_seconds"] for p in sliced["points"]} == {720.0}
    # the first 120 windows busy: slices 0-4 at 80 %, the rest idle
    assert [p["util_share"] for p in sliced["points"]] == [0.8] * 5 + [0.0] * 5
    for column in ("util_share", "memory_used_bytes"):
        assert max(p[column] for p in sliced["points"]) == max(p[column] for p in full["points"])


def test_the_overview_shows_each_reports_own_section(site: Site, browser: Any) -> None:
    browser.get(site.url(ps.ADMIN, "/reports"))
    shown = {t.get_attribute("id") for t in by_css(browser, "table[id^=overview-]")}
    assert shown == {f"overview-{name}" for name in ("idle_now", "failures", "queue", "taxonomy", "nodes")}
    # a researcher's overview has their own reports only (no operations report)
    browser.get(site.url(ps.RESEARCHER, "/reports"))
    shown = {t.get_attribute("id") for t in by_css(browser, "table[id^=overview-]")}
    assert shown == {"overview-idle_now", "overview-failures", "overview-queue"}
    # finance: aggregates, no running job
    browser.get(site.url(ps.FINANCE, "/reports"))
    shown = {t.get_attribute("id") for t in by_css(browser, "table[id^=overview-]")}
    assert shown == {"overview-failures", "overview-queue"}


def test_admins_see_the_fabric_of_the_jobs_nodes_on_its_page(site: Site) -> None:
    status, body, _ = ps.fetch(site.url(ps.ADMIN, "/jobs/103"))
    page = body.decode()
    assert status == 200 and page.count("Fabric of its nodes while it ran") == 2  # both attempts
    assert (
        "/reports/fabric_nodes?start=2026-11-01T10%3A00%3A00&amp;end=2026-11-01T12%3A00%3A00&amp;nodes=gpu02"
        in page
    )
    # job 402 ran an hour after an acceptance run (a real nccl-tests capture) used its node
    status, body, _ = ps.fetch(site.url(ps.ADMIN, "/jobs/402"))
    page = body.decode()
    assert "Acceptance runs on its nodes from a day before it started: 1" in page
    assert "nid005471,nid005487" in page
    # the fabric is cluster-wide operations data: not on a researcher's or coordinator's page
    for who, job in ((ps.RESEARCHER, "105"), (ps.COORDINATOR, "101")):
        assert "Fabric of its nodes" not in ps.fetch(site.url(who, f"/jobs/{job}"))[1].decode()


def test_gpus_idle_now_are_the_clis_and_name_the_idle_gpu(
    site: Site, browser: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmtel.columns import table_name
    from slurmtel.commands.idle_now import COLUMNS

    for who in (ps.ADMIN, ps.RESEARCHER, ps.COORDINATOR):
        rows = cli_json(site, who, monkeypatch, capsys, "report", "idle-now", "--format", "json")
        assert [
            (r["job_id"], r["idle_gpu_names"], r["idle_since_at"], r["idle_for_seconds"]) for r in rows
        ] == [("401", ["gpu07/1"], "2026-12-01T03:00:00+00:00", 3 * 3600.0)], who
        browser.get(site.url(who, "/reports/idle_now"))
        headers, cells = table_cells(browser, "section-idle_now")
        assert headers == [table_name(c) for c in COLUMNS]
        assert cells == [[shown(c, r[c]) for c in COLUMNS] for r in rows], who
    # nobody (no jobs) sees no running job; bob's view through the CLI is empty too
    browser.get(site.url(ps.NOBODY, "/reports/idle_now"))
    assert table_cells(browser, "section-idle_now")[1] == []
