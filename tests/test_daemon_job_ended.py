"""POST /v1/job-ended, the EpilogSlurmctld hook's endpoint, against the real daemon process
(`slurmtel run`), a real munged of the session's own (tests/munge_lab.py) and the real hook
script: who may post, that a refused post triggers nothing, that a burst is coalesced into
one sacct run, and that one peer's flood is rate-limited without starving another."""

from __future__ import annotations

import http.client
import os
import pwd
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine

from slurmtel.auth import munge
from tests import munge_lab
from tests.test_daemon import (
    EPILOG,
    SACCT_LAB,
    SAFETY_SECONDS,
    DaemonProcess,
    daemons,
    fake_sacct,
    labelled,
    metric,
    rows,
    wait_for,
)

__all__ = ["daemons"]  # the fixture: started daemons are killed at the end of each test

ME = pwd.getpwuid(os.getuid()).pw_name
TOKEN = "job-ended-token-0123456789"
# seconds the burst tests wait after the coalesced run, to see that no other run follows
QUIET_SECONDS = 3.0
# daemon.job_end_delay_seconds' default
DELAY_SECONDS = 5.0


@pytest.fixture(scope="module")
def munged() -> Iterator[munge_lab.Munged]:
    munge_lab.ensure_munge()
    with munge_lab.running() as daemon:
        yield daemon


def sacct_runs(calls: Path) -> int:
    return calls.read_text().count("\n") if calls.exists() else 0


def post(
    port: int, headers: dict[str, str] | None = None, body: bytes = b"job_id=42", source: str = "127.0.0.1"
) -> int:
    """One POST /v1/job-ended from SOURCE (any 127.x address is this host); the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/job-ended", body=body, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def munge_header(
    daemon: munge_lab.Munged, method: str = "POST", path: str = "/v1/job-ended"
) -> dict[str, str]:
    return {
        "Authorization": f"MUNGE {daemon.credential(munge.request_payload(method, path, munge.new_nonce()).decode())}"
    }


def start_daemon(
    tmp_path: Path,
    database_url: str,
    daemons: list[DaemonProcess],
    engine: Engine,
    munged: munge_lab.Munged,
    **daemon_settings: object,
) -> tuple[DaemonProcess, Path]:
    sacct, calls = fake_sacct(tmp_path, SACCT_LAB)
    token = tmp_path / "job-ended.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    settings = {
        "job_end_delay_seconds": 1.0,
        "job_end_users": [ME],
        "job_end_token_file": str(token),
        **daemon_settings,
    }
    daemon = DaemonProcess(
        tmp_path,
        {
            "sources": {"sacct": {"command": sacct, "interval_seconds": 3600}},
            "daemon": settings,
            "api": {"munge_socket": munged.socket},
        },
        database_url,
        env={
            "PATH": os.pathsep.join([str(Path(munge_lab.tool("unmunge")).parent), os.environ.get("PATH", "")])
        },
    )
    daemons.append(daemon.start())
    daemon.wait_serving()
    # the start-up run
    wait_for(lambda: sacct_runs(calls) == 1 and rows(engine, "SELECT 1 FROM collect_run"), "the first run")
    return daemon, calls


def test_only_authenticated_posts_move_sacct(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess], munged: munge_lab.Munged
) -> None:
    daemon, calls = start_daemon(tmp_path, database_url, daemons, engine, munged)
    other_key = munge_lab.running()
    stranger = other_key.__enter__()
    try:
        refused = {
            "nothing": post(daemon.port),
            "wrong token": post(daemon.port, {"Authorization": "Bearer not-the-token-at-all"}),
            "garbled munge": post(daemon.port, {"Authorization": "MUNGE MUNGE:garbage:"}),
            "another path": post(daemon.port, munge_header(munged, path="/v1/usage")),
            "another method": post(daemon.port, munge_header(munged, method="GET")),
            "another site's key": post(daemon.port, munge_header(stranger)),
            "no binding": post(daemon.port, {"Authorization": f"MUNGE {munged.credential('')}"}),
        }
    finally:
        other_key.__exit__(None, None, None)
    assert refused == dict.fromkeys(refused, 401), refused
    # the same credential twice: the second is a replay
    header = munge_header(munged)
    assert post(daemon.port, header) == 202
    assert post(daemon.port, header) == 401
    assert post(daemon.port, {"Authorization": f"Bearer {TOKEN}"}) == 202
    wait_for(lambda: sacct_runs(calls) == 2, "the run the accepted posts asked for")
    samples = daemon.metrics()
    assert metric(samples, "slurmtel_job_end_notifications_total") == 2
    assert metric(samples, "slurmtel_job_end_refused_total", reason="unauthenticated") == 8
    # /metrics stays open and names no user or job
    labels = {k for key in labelled(samples, "slurmtel_job_end_refused_total") for k, _ in key}
    assert labels == {"reason"}
    log = daemon.log()
    assert TOKEN not in log
    assert daemon.terminate()[0] == 0


def test_only_root_or_slurmuser_and_only_from_the_slurmctld_hosts(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess], munged: munge_lab.Munged
) -> None:
    munge_lab.require_root("a credential of another user")
    outsider = munge_lab.add_user()
    try:
        daemon, calls = start_daemon(
            tmp_path, database_url, daemons, engine, munged, job_end_peers=["127.0.0.1/32"]
        )
        payload = munge.request_payload("POST", "/v1/job-ended", munge.new_nonce()).decode()
        as_outsider = {"Authorization": f"MUNGE {munged.credential(payload, user=outsider)}"}
        assert post(daemon.port, as_outsider) == 403
        # from another address than the slurmctld host's: refused even with a good credential
        assert post(daemon.port, munge_header(munged), source="127.0.0.2") == 403
        assert post(daemon.port, {"Authorization": f"Bearer {TOKEN}"}, source="127.0.0.2") == 403
        assert metric(daemon.metrics(), "slurmtel_job_end_refused_total", reason="forbidden") == 3
        assert metric(daemon.metrics(), "slurmtel_job_end_notifications_total") in (None, 0.0)
        # the hook script, with munge, from the slurmctld host
        # beside munged's socket: a directory every user may pass (pytest's tmp_path is 0700)
        conf = munged.dir / f"epilog-{daemon.port}.conf"
        conf.write_text(f"SLURMTEL_DAEMON=127.0.0.1:{daemon.port}\nSLURMTEL_MUNGE_SOCKET={munged.socket}\n")
        conf.chmod(0o644)
        hook = subprocess.run(
            [str(EPILOG)],
            env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "77"},
            timeout=SAFETY_SECONDS,
            check=False,
        )
        assert hook.returncode == 0
        wait_for(
            lambda: metric(daemon.metrics(), "slurmtel_job_end_notifications_total") == 1, "the hook's post"
        )
        wait_for(lambda: sacct_runs(calls) == 2, "the run the hook asked for")
        assert "event=job_ended job_id=77 sacct=true" in daemon.log()
        # the same hook run as a user who is not SlurmUser is refused (and still exits 0)
        hook = subprocess.run(
            [munge_lab.tool("runuser"), "-u", outsider, "--", str(EPILOG)],
            env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "78"},
            timeout=SAFETY_SECONDS,
            check=False,
        )
        assert hook.returncode == 0
        wait_for(
            lambda: metric(daemon.metrics(), "slurmtel_job_end_refused_total", reason="forbidden") == 4,
            "the outsider's refusal",
        )
        assert daemon.terminate()[0] == 0
    finally:
        munge_lab.remove_user(outsider)


def _burst(port: int, headers: list[dict[str, str]], workers: int = 16) -> list[int]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda h: post(port, h), headers))


def test_a_burst_of_job_ends_makes_one_sacct_run(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess], munged: munge_lab.Munged
) -> None:
    """1,000 authenticated posts at once (token), then 1,000 with MUNGE credentials, with the
    default daemon.job_end_delay_seconds (5 s): a burst inside the delay is one sacct run."""
    daemon, calls = start_daemon(
        tmp_path,
        database_url,
        daemons,
        engine,
        munged,
        job_end_rate_per_second=100000.0,
        job_end_delay_seconds=DELAY_SECONDS,
    )
    t0 = time.monotonic()
    statuses = _burst(daemon.port, [{"Authorization": f"Bearer {TOKEN}"}] * 1000)
    token_seconds = time.monotonic() - t0
    assert statuses.count(202) + statuses.count(503) == 1000  # 503: over the concurrent checks
    accepted = statuses.count(202)
    wait_for(lambda: sacct_runs(calls) >= 2, "the coalesced run")
    time.sleep(QUIET_SECONDS)  # a quiet spell: no second run follows
    token_runs = sacct_runs(calls) - 1
    headers = [munge_header(munged) for _ in range(1000)]
    t0 = time.monotonic()
    munge_statuses = _burst(daemon.port, headers, workers=8)
    munge_seconds = time.monotonic() - t0
    munge_accepted = munge_statuses.count(202)
    wait_for(lambda: sacct_runs(calls) >= 2 + token_runs, "the second coalesced run")
    time.sleep(QUIET_SECONDS)
    munge_runs = sacct_runs(calls) - 1 - token_runs
    print(
        f"burst: {accepted} of 1000 token posts accepted in {token_seconds:.2f} s -> {token_runs} sacct "
        f"run(s); {munge_accepted} of 1000 MUNGE posts accepted in {munge_seconds:.2f} s -> {munge_runs} "
        "sacct run(s)"
    )
    assert accepted >= 900 and munge_accepted >= 900
    # posts inside the delay share one run; a machine so slow that a burst outlasts the delay
    # gets a second one (a post during a run asks for one more right after it), never more
    assert token_runs == 1 or (token_runs == 2 and token_seconds > DELAY_SECONDS)
    assert munge_runs == 1 or (munge_runs == 2 and munge_seconds > DELAY_SECONDS)
    assert metric(daemon.metrics(), "slurmtel_job_end_notifications_total") == accepted + munge_accepted
    assert daemon.terminate()[0] == 0


def test_a_flood_from_one_peer_is_rate_limited_and_starves_no_other(
    tmp_path: Path, engine: Engine, database_url: str, daemons: list[DaemonProcess], munged: munge_lab.Munged
) -> None:
    daemon, calls = start_daemon(tmp_path, database_url, daemons, engine, munged, job_end_rate_per_second=2.0)
    # a flood of unauthenticated posts from one address: after its burst (4), 429 without a look
    flood = [post(daemon.port, source="127.0.0.3") for _ in range(60)]
    assert flood.count(401) <= 4 + 2 and flood.count(429) >= 50
    # the slurmctld host, another address, is served
    assert post(daemon.port, munge_header(munged), source="127.0.0.1") == 202
    samples = daemon.metrics()
    assert metric(samples, "slurmtel_job_end_refused_total", reason="rate_limited") == flood.count(429)
    wait_for(lambda: sacct_runs(calls) == 2, "the run the slurmctld host asked for")
    assert daemon.terminate()[0] == 0


def test_the_hook_never_fails_when_munged_is_down(tmp_path: Path) -> None:
    conf = tmp_path / "epilog.conf"
    conf.write_text(f"SLURMTEL_DAEMON=127.0.0.1:9\nSLURMTEL_MUNGE_SOCKET={tmp_path / 'no.socket'}\n")
    hook = subprocess.run(
        [str(EPILOG)], env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "5"}, timeout=SAFETY_SECONDS
    )
    assert hook.returncode == 0
    # and a token file that is not there
    conf.write_text(f"SLURMTEL_DAEMON=127.0.0.1:9\nSLURMTEL_TOKEN_FILE={tmp_path / 'none'}\n")
    hook = subprocess.run(
        [str(EPILOG)], env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": "5"}, timeout=SAFETY_SECONDS
    )
    assert hook.returncode == 0


def test_an_unreadable_token_file_stops_the_daemon_at_start(
    tmp_path: Path, database_url: str, daemons: list[DaemonProcess]
) -> None:
    daemon = DaemonProcess(
        tmp_path, {"daemon": {"job_end_token_file": str(tmp_path / "missing")}}, database_url
    )
    daemons.append(daemon.start())
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=SAFETY_SECONDS) == 2
    assert "daemon.job_end_token_file: cannot read" in daemon.log()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("peers", [[], ["127.0.0.1/32"]], ids=["any-address", "job-end-peers"])
def test_slurmctld_posts_are_accepted_under_a_flood_from_60_addresses(
    tmp_path: Path,
    engine: Engine,
    database_url: str,
    daemons: list[DaemonProcess],
    munged: munge_lab.Munged,
    peers: list[str],
) -> None:
    """60 addresses (127.0.0.2-61) post as fast as they can, each under its own rate limit:
    genuine credentials of a user who may not post and well-formed forged ones, both of which
    only unmunge can tell apart. Meanwhile the real hook script, from slurmctld's address
    (127.0.0.1), reports 10 job ends: every one is accepted (at once, or by its retries)."""
    munge_lab.require_root("credentials of a user who may not post")
    outsider = munge_lab.add_user()
    try:
        daemon, _ = start_daemon(tmp_path, database_url, daemons, engine, munged, job_end_peers=peers)
        payload = munge.request_payload("POST", "/v1/job-ended", munge.new_nonce()).decode
        outsiders = [munged.credential(payload(), user=outsider) for _ in range(30)]
        forged = ["MUNGE:" + os.urandom(96).hex().upper()[:128] + ":" for _ in range(30)]
        stop = threading.Event()

        def flood(i: int) -> Counter[int]:
            statuses: Counter[int] = Counter()
            credentials = [outsiders[i % 30], forged[i % 30]]
            n = 0
            while not stop.is_set() and n < 2000:
                header = {"Authorization": f"MUNGE {credentials[n % 2]}"}
                statuses[post(daemon.port, header, source=f"127.0.0.{i + 2}")] += 1
                n += 1
            return statuses

        conf = munged.dir / f"epilog-{daemon.port}.conf"
        conf.write_text(f"SLURMTEL_DAEMON=127.0.0.1:{daemon.port}\nSLURMTEL_MUNGE_SOCKET={munged.socket}\n")
        conf.chmod(0o644)
        with ThreadPoolExecutor(max_workers=60) as pool:
            floods = [pool.submit(flood, i) for i in range(60)]
            try:
                time.sleep(1.0)  # the flood under way
                for job in range(10):
                    hook = subprocess.run(
                        [str(EPILOG)],
                        env={"SLURMTEL_EPILOG_CONF": str(conf), "SLURM_JOB_ID": str(100 + job)},
                        timeout=SAFETY_SECONDS,
                        check=False,
                    )
                    assert hook.returncode == 0
                wait_for(
                    lambda: metric(daemon.metrics(), "slurmtel_job_end_notifications_total") == 10,
                    "every job end the hook reported",
                    timeout=60,
                )
            finally:
                stop.set()
            statuses = sum((f.result() for f in floods), Counter())
        print(f"flood from 60 addresses: {dict(statuses)}")
        assert 202 not in statuses
        assert sum(statuses.values()) >= 600, statuses
        log = daemon.log()
        for job in range(10):
            assert f"event=job_ended job_id={100 + job} " in log
        assert "Traceback" not in log
        assert daemon.terminate()[0] == 0
    finally:
        munge_lab.remove_user(outsider)
