"""slurmtel in Open OnDemand: a non-interactive system app (Passenger runs this file in each
user's per-user nginx, as that user). Standard library only: it runs on OnDemand's python3.

    /pun/sys/slurmtel/JOBID        the job page of JOBID (the link slurmtel's e-mails carry)
    /pun/sys/slurmtel/             the caller's month
    /pun/sys/slurmtel/PAGE...      any other page of slurmtel (proxy mode)

Settings are KEY=VALUE lines in /etc/ood/config/apps/slurmtel/env (another file: SLURMTEL_OOD_ENV),
read on each request; the process environment wins over the file. Two modes (docs/pages.md):

- SLURMTEL_MODE=redirect (default): answer 302 to SLURMTEL_URL/jobs/JOBID (SLURMTEL_URL/me for
  the bare path). slurmtel sits behind the site's authenticating reverse proxy (OIDC with the
  same identity provider as OnDemand), which logs the user in and sends their name.
- SLURMTEL_MODE=proxy: fetch the page from `slurmtel serve` itself with the user's own Slurm
  JWT (SLURMTEL_TOKEN_COMMAND, by default `scontrol token lifespan=300`, run as the user by
  this PUN) and return it, links kept under /pun/sys/slurmtel/. slurmtel believes the token,
  not this app: a PUN runs the user's code and is never a trusted proxy.

A job id that is not one is answered 400 here, before anything is asked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import urllib.error
import urllib.parse
import urllib.request

JOB_ID = re.compile(r"[0-9]{1,10}(_[0-9]{1,10}|\+[0-9]{1,4})?")
# the pages of slurmtel the proxy mode passes on (and nothing else of the server)
PAGES = re.compile(
    r"(jobs/[0-9_+]+(/(figures|timeline)\.(json|csv))?|me|reports(/[a-z_]+)?|finance(/[0-9-]+(/statement\.(csv|json|parquet))?)?)"
)
PREFIX_DEFAULT = "/pun/sys/slurmtel"


ENV_FILE = "/etc/ood/config/apps/slurmtel/env"


def _settings():
    """The app's settings: the env file's KEY=VALUE lines, then the process environment."""
    found = {}
    try:
        with open(os.environ.get("SLURMTEL_OOD_ENV", ENV_FILE), encoding="utf-8") as lines:
            for line in lines:
                key, sep, value = line.strip().partition("=")
                if sep and key and not key.startswith("#"):
                    found[key.strip()] = value.strip().strip("'\"")
    except OSError:
        pass
    found.update({k: v for k, v in os.environ.items() if k.startswith("SLURMTEL_")})
    return found


def _answer(start_response, status, body=b"", headers=()):
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
    return [body]


def _target(path):
    """The slurmtel page for the app-relative PATH, or None."""
    path = path.strip("/")
    if not path:
        return "/me"
    if JOB_ID.fullmatch(path):
        return f"/jobs/{path}"
    if PAGES.fullmatch(path):
        return f"/{path}"
    return None


def _token(settings):
    command = shlex.split(settings.get("SLURMTEL_TOKEN_COMMAND", "scontrol token lifespan=300"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    match = re.search(r"SLURM_JWT=(\S+)", done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"{command[0]} gave no token: {done.stderr.strip()[:200]}")
    return match.group(1)


def application(environ, start_response):
    settings = _settings()
    base = settings.get("SLURMTEL_URL", "").rstrip("/")
    if not base:
        return _answer(
            start_response, "500 Internal Server Error", b"SLURMTEL_URL is not set (docs/pages.md)\n"
        )
    prefix = environ.get("SCRIPT_NAME", "") or PREFIX_DEFAULT
    target = _target(environ.get("PATH_INFO", ""))
    if target is None:
        return _answer(start_response, "400 Bad Request", b"not a job id or a page of slurmtel\n")
    query = environ.get("QUERY_STRING", "")
    url = base + target + (f"?{query}" if query else "")
    if settings.get("SLURMTEL_MODE", "redirect") == "redirect":
        return _answer(start_response, "302 Found", headers=[("Location", url)])
    if environ.get("REQUEST_METHOD", "GET") != "GET":
        return _answer(
            start_response, "405 Method Not Allowed", b"closing and voiding: open slurmtel itself\n"
        )
    try:
        token = _token(settings)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return _answer(start_response, "503 Service Unavailable", f"no Slurm token: {exc}\n".encode())
    request = urllib.request.Request(url, headers={"X-SLURM-USER-TOKEN": token})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, body, kind = response.status, response.read(), response.headers.get("Content-Type", "")
            disposition = response.headers.get("Content-Disposition")
    except urllib.error.HTTPError as exc:
        status, body, kind, disposition = exc.code, exc.read(), exc.headers.get("Content-Type", ""), None
    except OSError as exc:
        return _answer(start_response, "502 Bad Gateway", f"slurmtel at {base}: {exc}\n".encode())
    if kind.startswith("text/html"):
        # the pages link to their own absolute paths: keep them under this app
        body = re.sub(rb'(href|action)="/', rb'\1="' + prefix.encode() + b"/", body)
    headers = [("Content-Type", kind or "application/octet-stream")]
    if disposition:
        headers.append(("Content-Disposition", disposition))
    start_response(f"{status} {'OK' if status == 200 else 'Error'}", headers)
    return [body]
