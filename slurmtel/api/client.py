"""The CLI on a login node: `slurmtel me`, `job`, `report` and `chargeback` ask `slurmtel serve`
(config `[api] url`) instead of a database, and print what the API sends with the same code that
prints a local result.

Each request carries a fresh MUNGE credential from the local munged whose payload is the
request's method, path and a nonce (slurmtel.auth.munge): the server learns the caller's uid
from MUNGE, never from anything this client says, so editing the client config grants nothing.
"""

from __future__ import annotations

import ipaddress
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmtel.auth.munge import encode_credential, new_nonce, request_payload
from slurmtel.columns import decode_value
from slurmtel.config import Config
from slurmtel.errors import AccessDenied, ConfigError, SlurmtelError, SourceUnavailable
from slurmtel.filters import JobFilter

TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes


class ApiClient:
    def __init__(self, config: Config) -> None:
        url = config.api.url.rstrip("/")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"api.url must be an http:// or https:// URL, not '{config.api.url}'")
        if parts.scheme == "http" and not _loopback(parts.hostname or "") and not config.api.allow_plain_http:
            raise ConfigError(
                f"api.url {url} is plain http:// to another host: your requests and their answers "
                "would cross the network unencrypted; use https:// (api.tls_cert_file on the server) "
                "or set api.allow_plain_http = true"
            )
        self.base = url
        self.prefix = parts.path
        self.munge_socket = config.api.munge_socket or None

    # --- one request

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None) -> Reply:
        """METHOD PATH (under /v1) with a MUNGE credential bound to it."""
        wanted = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        query_string = "?" + urllib.parse.urlencode(wanted) if wanted else ""
        # the credential covers the query string too: it is good for this request only
        target = f"{self.prefix}{path}{query_string}"
        credential = encode_credential(request_payload(method, target, new_nonce()), self.munge_socket)
        url = self.base + path + query_string
        req = urllib.request.Request(url, method=method, headers={"Authorization": f"MUNGE {credential}"})
        context = ssl.create_default_context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS, context=context) as response:
                return Reply(response.status, dict(response.headers.items()), response.read())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, dict(exc.headers.items()), exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceUnavailable(f"cannot reach slurmtel serve at {self.base}: {reason}") from None

    def json(
        self, method: str, path: str, query: Mapping[str, str] | None = None, *, not_found_ok: bool = False
    ) -> Any:
        reply = self.request(method, path, query)
        if reply.status == 404 and not_found_ok:
            return None
        _raise_for(reply)
        return json.loads(reply.body)

    # --- the views

    def report(
        self,
        name: str,
        *,
        start: str | None,
        end: str | None,
        job_filter: JobFilter,
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        query = {
            "start": start or "",
            "end": end or "",
            "accounts": ",".join(job_filter.accounts),
            "users": ",".join(job_filter.users),
            "partitions": ",".join(job_filter.partitions),
            "clusters": ",".join(job_filter.clusters),
            **{k: _query_value(v) for k, v in options.items()},
        }
        document = self.json("GET", f"/v1/reports/{name}", query)
        for section in document["sections"]:
            section["rows"] = [{c: decode_value(c, v) for c, v in row.items()} for row in section["rows"]]
        return document

    def job(self, jobid: str, clusters: Sequence[str]) -> list[dict[str, Any]]:
        document = self.json(
            "GET",
            f"/v1/jobs/{urllib.parse.quote(jobid)}",
            {"clusters": ",".join(clusters)},
            not_found_ok=True,
        )
        if document is None:
            return []
        return [decoded(r) for r in document]

    def job_plot(self, jobid: str, clusters: Sequence[str], fmt: str) -> tuple[bytes, bool] | None:
        reply = self.request(
            "GET", f"/v1/jobs/{urllib.parse.quote(jobid)}/plot.{fmt}", {"clusters": ",".join(clusters)}
        )
        if reply.status == 404:
            return None
        _raise_for(reply)
        empty = {k.lower(): v for k, v in reply.headers.items()}.get("x-slurmtel-plot-empty") == "true"
        return reply.body, not empty

    def me(self, *, user: str | None, month: str | None, jobs: bool, top: int) -> dict[str, Any]:
        query = {"user": user or "", "month": month or "", "jobs": "1" if jobs else "", "top": str(top)}
        return dict(decoded(self.json("GET", "/v1/me", query)))

    def actions(
        self,
        *,
        start: str | None,
        end: str | None,
        user: str | None,
        job: str | None,
        rule: str | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """The record of messages and actions the server lets the caller see (`act log`)."""
        query = {
            "start": start or "",
            "end": end or "",
            "user": user or "",
            "job": job or "",
            "rule": rule or "",
            "limit": str(limit),
        }
        rows = self.json("GET", "/v1/actions", {k: v for k, v in query.items() if v})
        return [{k: decode_value(k, v) if k.endswith("_at") else v for k, v in r.items()} for r in rows]

    def statement(self, month: str, *, fmt: str, close: bool) -> tuple[bytes, list[str], bool]:
        """(bytes, notices, refused) of MONTH's statement; CLOSE closes it first."""
        path = f"/v1/chargeback/{urllib.parse.quote(month)}" + ("/close" if close else "")
        reply = self.request("POST" if close else "GET", path, {"format": fmt})
        if reply.status not in (200, 409):
            _raise_for(reply)
        headers = {k.lower(): v for k, v in reply.headers.items()}
        notices = [
            urllib.parse.unquote(headers[k])
            for k in sorted((k for k in headers if k.startswith("x-slurmtel-notice-")), key=_notice_order)
        ]
        return reply.body, notices, reply.status == 409


def decoded(document: Any, column: str = "") -> Any:
    """A job's or a month's document as the API carried it, each value back as the type its
    registered column holds (exact decimals and instants from text): it prints as the head's."""
    if isinstance(document, dict):
        return {k: decoded(v, k) for k, v in document.items()}
    if isinstance(document, list):
        return [decoded(v, column) for v in document]
    return decode_value(column, document)


def _loopback(host: str) -> bool:
    """Whether HOST is this machine by name or address (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _notice_order(header: str) -> int:
    return int(header.rsplit("-", 1)[1])


def _query_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else ""
    return str(value)


def _raise_for(reply: Reply) -> None:
    if 200 <= reply.status < 300:
        return
    try:
        message = json.loads(reply.body)["error"]
    except (ValueError, KeyError, TypeError):
        message = reply.body[:200].decode("utf-8", "replace")
    if reply.status in (401, 403):
        raise AccessDenied(f"slurmtel serve refused: {message}")
    if reply.status in (400, 404):
        raise ConfigError(message)
    raise SlurmtelError(f"slurmtel serve answered {reply.status}: {message}")


def say(notices: Sequence[str]) -> None:
    for notice in notices:
        print(f"slurmtel: {notice}", file=sys.stderr)
