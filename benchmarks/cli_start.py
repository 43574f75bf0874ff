"""How long the `slurmtel` command takes end to end (a fresh interpreter per run, as a user
types it), against the 0.3 s a command should answer in (issue 12), in one run:

- a bare interpreter (`python -c pass`), for reference: the machine's floor;
- `slurmtel --version` and `slurmtel --help`: parsing only, no database stack;
- the floor of any command that reads the database: the config and psycopg imported, one
  connection (the embedded PostgreSQL joined, if that is the site's) with the schema checked,
  as `job`, `me` and `report` open it (slurmtel.store.reader), and `SELECT 1`;
- `slurmtel job JOBID`, `slurmtel me`, `slurmtel report usage`, `slurmtel report idle` on a
  small real database;
- the login node's path (a config with only `[api] url`): `slurmtel serve` started on that
  database with a munged of the benchmark's own (Debian's `munge` package; without it this part
  is left out, saying so), then `job`, `me` and `report idle` through it, against a bare
  interpreter asking the same `GET /v1/jobs/JOBID` with urllib (its MUNGE credential from
  `munge`, as the CLI's): both counted with the server's and munged's CPU.

Each figure is the best of --repeat runs (the machine's noise only ever adds), after one run
not counted that writes the bytecode cache (into a temporary PYTHONPYCACHEPREFIX, whatever
PYTHONDONTWRITEBYTECODE says): an installed slurmtel has its .pyc files, and compiling the
sources on every run would be measured otherwise. With --config
FILE --job JOBID the commands read that site's database (--user/--month for `me`, and -S/-E
for `report usage` if given). With --dsn URL the benchmark loads --jobs synthetic attempts
(the real sacct parser and writer, as benchmarks/reports.py) into a scratch database on that
server, dropped afterwards. With neither it makes its own small one with `slurmtel demo` (an
embedded PostgreSQL under a temporary state directory: about a minute; the embedded server is
started and stopped by every command, which the figures include). Every command is run as `python -m slurmtel` in this checkout, with it first on
PYTHONPATH, so the tree measured is this one whatever the directory the benchmark is started from
(`-m` puts the working directory before PYTHONPATH).

    python benchmarks/cli_start.py [--repeat 5] [--config FILE --job JOBID [--user U] [--month YYYY-MM]]
    python benchmarks/cli_start.py [--repeat 5] --dsn URL [--jobs 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 0.3

# what every command that reads the database pays before its own work: the config, psycopg,
# one connection and the schema check (slurmtel.store.reader), and SELECT 1
FLOOR = """
import sys
from slurmtel.config import load_config
from slurmtel.store.reader import connect_reader
from slurmtel.store.sql import text
with connect_reader(load_config(sys.argv[1])) as conn:
    conn.execute(text("SELECT 1"))
"""

# a bare client of the API: one request, its MUNGE credential bound to it as slurmtel's client
# binds it (slurmtel.auth.munge.request_payload), the answer decoded and printed
BARE_API = """
import json, secrets, subprocess, sys, urllib.request
url, path, sock = sys.argv[1], sys.argv[2], sys.argv[3]
payload = ("GET %s %s" % (path, secrets.token_hex(16))).encode()
done = subprocess.run(["munge", "-S", sock], input=payload, capture_output=True, check=True)
request = urllib.request.Request(url + path, headers={"Authorization": "MUNGE " + done.stdout.decode().strip()})
with urllib.request.urlopen(request, timeout=60) as answer:
    print(json.dumps(json.load(answer))[:200])
"""
MUNGE_TOOLS = ("munge", "munged", "mungekey")
MUNGE_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])

PYCACHE = tempfile.mkdtemp(prefix="slurmtel-cli-start-pyc-")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def best_of(argv: list[str], repeat: int, meter: Any) -> Any:
    """The fastest of REPEAT runs of ARGV (a cputime.Usage: wall, and CPU of the command and of
    its backend); a failing run is an error."""
    from cputime import Usage

    best = Usage(float("inf"), 0.0)
    subprocess.run(argv, env=_env(), cwd=ROOT, capture_output=True, timeout=300, check=False)
    for _ in range(repeat):
        with meter.measure() as section:
            done = subprocess.run(argv, env=_env(), cwd=ROOT, capture_output=True, timeout=300, check=False)
        if done.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
            )
        best = min(best, section.usage, key=lambda usage: usage.wall)
    return best


def make_demo(state: Path) -> tuple[Path, str, str, str]:
    """A small database of its own: `slurmtel demo` under STATE. Returns its config, a job id,
    a user and a month the demo printed views of."""
    base = state / "base.toml"
    base.write_text(f'[site]\nstate_dir = "{state}"\n')
    print(f"making a small database with `slurmtel demo` under {state} (about a minute)...", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "slurmtel", "--config", str(base), "demo"],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"slurmtel demo failed: {done.stderr.strip()}")
    job = re.search(r"^\$ slurmtel .* job (\S+)", done.stdout, re.M)
    me = re.search(r"^\$ slurmtel .* me --user (\S+) --month (\S+)", done.stdout, re.M)
    if not job or not me:
        raise SystemExit("slurmtel demo did not show a job and a user's month")
    return state / "demo" / "slurmtel.toml", job.group(1), me.group(1), me.group(2)


def load_scratch(engine: Any, jobs: int, folder: Path) -> tuple[Path, str, str, str, str, str]:
    """--jobs synthetic attempts in ENGINE's database and a config naming it. Returns the
    config, a job id, a user, the month and the window (-S, -E) the attempts are in."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reports import END, START, load_attempts
    from sqlalchemy import text

    with engine.begin() as conn:
        load_attempts(conn, jobs, 1000)
        job, user = conn.execute(
            text("SELECT job_id, user_name FROM job_attempt ORDER BY job_id_raw LIMIT 1")
        ).one()
    config = folder / "slurmtel.toml"
    url = engine.url.render_as_string(hide_password=False)
    config.write_text(
        f'[site]\nstate_dir = "{folder}"\nclock = "{END.isoformat()}"\n\n[database]\nurl = "{url}"\n'
    )
    return config, str(job), str(user), START.strftime("%Y-%m"), START.isoformat(), END.isoformat()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def munged(folder: Path) -> Iterator[tuple[str, int]]:
    """A munged of the benchmark's own (its key, socket, pid and log under FOLDER): its socket
    and pid."""
    tool = {name: shutil.which(name, path=MUNGE_PATH) or name for name in MUNGE_TOOLS}
    folder.mkdir(mode=0o711)
    key, sock, pid = folder / "munge.key", str(folder / "munge.socket"), folder / "munged.pid"
    subprocess.run([tool["mungekey"], "-c", "-k", str(key)], check=True, timeout=60)
    key.chmod(0o600)
    args = [tool["munged"], f"--socket={sock}", f"--pid-file={pid}", f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}", f"--key-file={key}"]  # fmt: skip
    if os.geteuid() == 0:
        args.insert(1, "--force")
    subprocess.run(args, check=True, timeout=60, capture_output=True)
    try:
        for _ in range(300):
            if Path(sock).exists() and pid.exists() and pid.read_text().strip():
                break
            time.sleep(0.05)
        yield sock, int(pid.read_text())
    finally:
        subprocess.run([tool["munged"], f"--socket={sock}", "--stop"], check=False, timeout=60)


@contextlib.contextmanager
def serving(config: Path, sock: str, folder: Path) -> Iterator[tuple[str, int]]:
    """`slurmtel serve` on CONFIG's database (its [api] port and munge socket added), until it
    answers /healthz: its URL and pid."""
    port = free_port()
    head = folder / "head.toml"
    head.write_text(f'{config.read_text()}\n[api]\nport = {port}\nmunge_socket = "{sock}"\n')
    server = subprocess.Popen(
        [sys.executable, "-m", "slurmtel", "--config", str(head), "serve"],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise SystemExit(
                    f"slurmtel serve ended: {server.stderr.read().decode() if server.stderr else ''}"
                )
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per command; the best counts")
    parser.add_argument("--config", type=Path, default=None, help="a site's config (else: a demo database)")
    parser.add_argument("--job", default=None, help="a job id in that site's data (with --config)")
    parser.add_argument("--user", default=None, help="`me --user` (default: the caller)")
    parser.add_argument("--month", default=None, help="`me --month` (default: this month)")
    parser.add_argument("-S", dest="start", default=None, help="`report usage -S`")
    parser.add_argument("-E", dest="end", default=None, help="`report usage -E`")
    parser.add_argument("--dsn", default=None, help="a server for a scratch database (else: a demo database)")
    parser.add_argument("--jobs", type=int, default=2000, help="attempts loaded with --dsn")
    args = parser.parse_args()
    if (args.config is None) != (args.job is None):
        parser.error("--config and --job go together")
    if args.config is not None and args.dsn is not None:
        parser.error("--config or --dsn, not both")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cputime import Meter

    meter = Meter()
    engine = None
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="slurmtel-cli-start-")))
        if args.dsn is not None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from scratch import scratch_database

            engine = stack.enter_context(scratch_database(args.dsn, prefix="slurmtel_cli_start"))
            # each command's backend exits with it: counted from the postmaster's children
            meter = Meter(engine, exited_backends=True)
            print(f"loading {args.jobs} synthetic attempts into a scratch database...", flush=True)
            args.config, args.job, args.user, args.month, args.start, args.end = load_scratch(
                engine, args.jobs, tmp
            )
        elif args.config is None:
            args.config, args.job, args.user, args.month = make_demo(tmp)
        slurmtel = [sys.executable, "-m", "slurmtel"]
        site = [*slurmtel, "--config", str(args.config)]
        me = [*site, "me"]
        if args.user:
            me += ["--user", args.user]
        if args.month:
            me += ["--month", args.month]
        window = [*(["-S", args.start] if args.start else []), *(["-E", args.end] if args.end else [])]
        usage = [*site, "report", "usage", *window]
        idle = [*site, "report", "idle", *window]
        runs = [
            ("python -c pass (bare interpreter)", [sys.executable, "-c", "pass"], False),
            ("slurmtel --version", [*slurmtel, "--version"], True),
            ("slurmtel --help", [*slurmtel, "--help"], True),
            (
                "floor: connect, schema, SELECT 1",
                [sys.executable, "-c", FLOOR, str(args.config)],
                False,
            ),
            (f"slurmtel job {args.job}", [*site, "job", args.job], True),
            ("slurmtel me" + (f" --user {args.user}" if args.user else ""), me, True),
            ("slurmtel report usage", usage, True),
            ("slurmtel report idle", idle, True),
        ]
        print(f"best of {args.repeat} runs, seconds end to end (target: under {TARGET_SECONDS} s)")
        bare = None
        for label, argv, judged in runs:
            usage = best_of(argv, args.repeat, meter)
            bare = bare or usage
            seconds = usage.wall
            verdict = ("ok" if seconds < TARGET_SECONDS else "OVER") if judged else ""
            print(f"  {label:<40} {seconds:6.3f}  {verdict}", flush=True)
            print(
                f"    {usage}; x bare interpreter: wall {seconds / bare.wall:.1f}, CPU {usage.cpu / bare.cpu:.1f}"
            )
        through_api(args, window, tmp, stack, engine)
    shutil.rmtree(PYCACHE, ignore_errors=True)
    return 0


def through_api(
    args: argparse.Namespace, window: list[str], tmp: Path, stack: contextlib.ExitStack, engine: Any
) -> None:
    """The login node's path: job, me and report idle through `slurmtel serve`, against a bare
    urllib client's one request of the same job. The server's CPU is counted (with its database
    backends' when ENGINE, the scratch database, is given)."""
    from cputime import Meter

    missing = [name for name in MUNGE_TOOLS if shutil.which(name, path=MUNGE_PATH) is None]
    if missing:
        print(f"the API path: not measured ({', '.join(missing)} missing; Debian: apt-get install munge)")
        return
    if "[api]" in args.config.read_text():
        print(f"the API path: not measured ({args.config} has an [api] table of its own)")
        return
    sock, munged_pid = stack.enter_context(munged(tmp / "munge"))
    url, server_pid = stack.enter_context(serving(args.config, sock, tmp))
    client = tmp / "client.toml"
    client.write_text(f'[api]\nurl = "{url}"\nmunge_socket = "{sock}"\n')
    api = [sys.executable, "-m", "slurmtel", "--config", str(client)]
    me = [
        *api,
        "me",
        *(["--user", args.user] if args.user else []),
        *(["--month", args.month] if args.month else []),
    ]
    meter = Meter(engine, server_pids=(server_pid, munged_pid))
    print(
        f"the API path: through `slurmtel serve` ({url}), with its and munged's CPU; best of {args.repeat} runs"
    )
    bare = best_of([sys.executable, "-c", BARE_API, url, f"/v1/jobs/{args.job}", sock], args.repeat, meter)
    print(f"  {'bare python + urllib: GET /v1/jobs/' + args.job:<40} {bare.wall:6.3f}", flush=True)
    print(f"    {bare}")
    for label, argv in (
        (f"slurmtel job {args.job} (API)", [*api, "job", args.job]),
        ("slurmtel me (API)", me),
        ("slurmtel report idle (API)", [*api, "report", "idle", *window]),
    ):
        usage = best_of(argv, args.repeat, meter)
        verdict = "ok" if usage.wall < TARGET_SECONDS else "OVER"
        print(f"  {label:<40} {usage.wall:6.3f}  {verdict}", flush=True)
        print(
            f"    {usage}; x the bare client: wall {usage.wall / bare.wall:.1f}, CPU {usage.cpu / bare.cpu:.1f}"
        )


if __name__ == "__main__":
    sys.exit(main())
