"""The I/O the sources do: run a Slurm command, fetch a URL. Failures are SourceUnavailable."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from slurmtel.errors import SourceUnavailable

if TYPE_CHECKING:
    import ssl
    import urllib.error


def run_command(
    argv: Sequence[str], *, timeout_seconds: float, env: Mapping[str, str] | None = None
) -> bytes:
    """Run ARGV and return its stdout; a missing binary, a timeout or a non-zero exit raise."""
    name = argv[0]
    try:
        proc = subprocess.run(list(argv), capture_output=True, env=env, timeout=timeout_seconds, check=False)
    except FileNotFoundError as exc:
        raise SourceUnavailable(f"{name} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise SourceUnavailable(f"{name} did not answer within {timeout_seconds:g} s") from exc
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
        raise SourceUnavailable(f"{name} failed: {err}")
    return proc.stdout


def http_request(
    url: str,
    *,
    timeout_seconds: float,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    shown_url: str | None = None,
    error_detail: Callable[[urllib.error.HTTPError], str] | None = None,
) -> bytes:
    """GET (or POST with DATA) URL and return the body; any failure raises SourceUnavailable,
    naming SHOWN_URL (default URL) and, for a refused request, what ERROR_DETAIL reads of it."""
    # imported here: urllib.request (http.client, ssl) is more than a command line needs to start
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=data, headers=dict(headers or {}), method="POST" if data else "GET"
    )
    where = shown_url or url
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds, context=context) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        detail = error_detail(exc) if error_detail else ""
        raise SourceUnavailable(f"{where}: HTTP {exc.code} {exc.reason}{detail}") from exc
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceUnavailable(f"{where}: {reason}") from exc
