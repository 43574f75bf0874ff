"""MUNGE credentials bound to one HTTP request, through the `munge` and `unmunge` commands.

Client: `encode_credential(request_payload(method, target, nonce))` runs `munge` (the site's
munged stamps the caller's uid and gid, which nobody can forge without the MUNGE key) and the
credential travels as `Authorization: MUNGE <credential>`.

Server: `decode_credential` runs `unmunge` against the server's munged, `parse_unmunge` reads
its metadata (a pure function, tested on real unmunge output), and `check_request` checks the
payload names this request's method and target and carries a nonce, and that the credential is no
older than the server's own limit (`api.credential_ttl_seconds`, with an injected clock; munged
enforces the TTL the client asked for, at most its --max-ttl). TARGET is the path and the query
string exactly as sent ("/v1/reports/usage?start=2026-11-01&top=5"): a credential for one query
is no good for another. MUNGE rejects a replay only on
the munged that decoded the first copy; the replay cache (replay.py) is the server's own check.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from slurmtel.errors import (
    AuthUnavailable,
    CredentialExpired,
    CredentialInvalid,
    CredentialReplayed,
    ParseError,
)

AUTH_SCHEME = "MUNGE"
# a credential is base64 between "MUNGE:" and ":"; anything else never reaches unmunge
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/]+={0,2}:")
MAX_CREDENTIAL_CHARS = 8192
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_METHOD = re.compile(r"[A-Z]{1,16}")
# a credential dated this far after the server's clock is refused (clocks of two hosts differ)
MAX_CLOCK_SKEW_SECONDS = 30
COMMAND_TIMEOUT_SECONDS = 5.0

# libmunge's munge_err_t values that unmunge exits with (munge.h)
EMUNGE_SUCCESS = 0
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
# 8 bad credential format, 9 version, 10 cipher, 11 MAC, 12 zip, 13 realm, 14 invalid,
# 18 unauthorized (restricted to another uid/gid)
_INVALID = frozenset({3, 4, 8, 9, 10, 11, 12, 13, 14, 18})
_UNAVAILABLE = frozenset({1, 5, EMUNGE_SOCKET, EMUNGE_TIMEOUT})


@dataclass(frozen=True)
class MungeCredential:
    """What unmunge says of a credential (its metadata) and the payload it carried."""

    status: int
    status_text: str
    encode_host: str
    encoded_at: datetime
    decoded_at: datetime
    ttl_seconds: int
    uid: int
    gid: int
    payload: bytes
    # the names unmunge gave (its own passwd/group); "" in numeric output
    user_name: str = ""
    group_name: str = ""

    @property
    def expires_at(self) -> datetime:
        return self.encoded_at + timedelta(seconds=self.ttl_seconds)


@dataclass(frozen=True)
class BoundRequest:
    """The request a credential's payload names."""

    method: str
    # the path, with "?" and the query string when the request has one
    path: str
    nonce: str


def new_nonce() -> str:
    return secrets.token_hex(16)


def request_payload(method: str, path: str, nonce: str) -> bytes:
    """The canonical payload "METHOD TARGET NONCE": PATH is the request's target, its query
    string included exactly as it is sent."""
    if not _METHOD.fullmatch(method) or not _NONCE.fullmatch(nonce) or not _valid_path(path):
        raise ValueError(f"cannot bind {method!r} {path!r} {nonce!r}")
    return f"{method} {path} {nonce}".encode()


def _valid_path(path: str) -> bool:
    return path.startswith("/") and path.isascii() and path.isprintable() and " " not in path


def parse_payload(payload: bytes) -> BoundRequest:
    """The inverse of request_payload; CredentialInvalid for anything else."""
    try:
        text = payload.decode("ascii")
    except UnicodeDecodeError:
        raise CredentialInvalid("credential payload is not ASCII") from None
    parts = text.split(" ")
    if len(parts) != 3:
        raise CredentialInvalid("credential payload is not 'METHOD PATH NONCE'")
    method, path, nonce = parts
    if not _METHOD.fullmatch(method) or not _valid_path(path) or not _NONCE.fullmatch(nonce):
        raise CredentialInvalid("credential payload is not 'METHOD PATH NONCE'")
    return BoundRequest(method, path, nonce)


def encode_credential(
    payload: bytes,
    socket: str | None = None,
    *,
    ttl_seconds: int = 0,
    command: str = "munge",
    timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
) -> str:
    """A credential for PAYLOAD from the local munged (`munge`, payload on stdin; `-n` when
    empty). TTL_SECONDS 0 = munged's default. AuthUnavailable when munge cannot make one."""
    args = [command, *(["-S", socket] if socket else []), *(["-t", str(ttl_seconds)] if ttl_seconds else [])]
    if not payload:
        args.append("-n")
    try:
        done = subprocess.run(args, input=payload, capture_output=True, timeout=timeout_seconds, check=False)
    except FileNotFoundError:
        raise AuthUnavailable(f"{command} not found (install MUNGE)") from None
    except subprocess.TimeoutExpired:
        raise AuthUnavailable(f"{command} timed out after {timeout_seconds} s") from None
    if done.returncode != 0:
        raise AuthUnavailable(_first_line(done.stderr) or f"{command} exited with status {done.returncode}")
    credential = done.stdout.decode("ascii", "replace").strip()
    if not _CREDENTIAL.fullmatch(credential):
        raise AuthUnavailable(f"{command} printed no credential")
    return credential


def authorization_header(method: str, path: str, socket: str | None = None, *, command: str = "munge") -> str:
    """The client's `Authorization` value for one request: `MUNGE <credential>` bound to
    METHOD, PATH (with its query string, as sent) and a fresh nonce. AuthUnavailable without munged."""
    payload = request_payload(method, path, new_nonce())
    return f"{AUTH_SCHEME} {encode_credential(payload, socket, command=command)}"


def looks_like_credential(credential: str) -> bool:
    """Whether CREDENTIAL has the shape of a MUNGE credential (what unmunge is ever given)."""
    return len(credential) <= MAX_CREDENTIAL_CHARS and _CREDENTIAL.fullmatch(credential) is not None


def decode_credential(
    credential: str,
    socket: str | None = None,
    *,
    command: str = "unmunge",
    timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
) -> MungeCredential:
    """Decode CREDENTIAL with the local munged (`unmunge`, credential on stdin).

    CredentialInvalid (garbled, tampered, another key), CredentialExpired (past its TTL, or
    rewound), CredentialReplayed (this munged decoded it before), AuthUnavailable (munged not
    running, unmunge missing or slow)."""
    if not looks_like_credential(credential):
        raise CredentialInvalid("not a MUNGE credential")
    args = [command, *(["-S", socket] if socket else [])]
    try:
        done = subprocess.run(
            args, input=credential.encode(), capture_output=True, timeout=timeout_seconds, check=False
        )
    except FileNotFoundError:
        raise AuthUnavailable(f"{command} not found (install MUNGE)") from None
    except subprocess.TimeoutExpired:
        raise AuthUnavailable(f"{command} timed out after {timeout_seconds} s") from None
    status = done.returncode
    message = _first_line(done.stderr)
    if status == EMUNGE_SUCCESS:
        try:
            return parse_unmunge(done.stdout)
        except ParseError as exc:
            raise CredentialInvalid(f"unreadable unmunge output: {exc}") from None
    if status == EMUNGE_CRED_REPLAYED:
        raise CredentialReplayed("credential replayed (munged decoded it before)")
    if status in (EMUNGE_CRED_EXPIRED, EMUNGE_CRED_REWOUND):
        raise CredentialExpired(
            "credential expired" if status == EMUNGE_CRED_EXPIRED else "credential rewound"
        )
    if status in _UNAVAILABLE:
        raise AuthUnavailable(message or f"{command} exited with status {status}")
    if status in _INVALID:
        raise CredentialInvalid(message.removeprefix("unmunge: Error: ") or "invalid credential")
    raise AuthUnavailable(message or f"{command} exited with status {status}")


_NUMBER_IN_PARENS = re.compile(r"\((-?\d+)\)\s*$")
_REQUIRED = ("STATUS", "ENCODE_TIME", "DECODE_TIME", "TTL", "UID", "GID")


def parse_unmunge(output: bytes | str) -> MungeCredential:
    """unmunge's stdout: "KEY: value" metadata lines, a blank line, then the payload.

    Values are read in both forms unmunge prints: `UID: alice (1001)` (default) and `UID: 1001`
    (`-N`); times are the epoch seconds, in parentheses or alone. ParseError when a key is
    missing or a value is not a number."""
    raw = output.encode() if isinstance(output, str) else output
    head, sep, payload = raw.partition(b"\n\n")
    if not sep:
        # LENGTH 0 and no trailing blank line: metadata only
        head, payload = raw.rstrip(b"\n"), b""
    fields: dict[str, str] = {}
    for line in head.decode("utf-8", "replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise ParseError(f"unmunge output lacks {', '.join(missing)}")
    status, status_text = _number_and_name(fields["STATUS"], "STATUS")
    uid, user = _number_and_name(fields["UID"], "UID")
    gid, group = _number_and_name(fields["GID"], "GID")
    length = fields.get("LENGTH")
    if length is not None and length.isdigit() and int(length) != len(payload):
        raise ParseError(f"unmunge payload is {len(payload)} bytes, LENGTH says {length}")
    host = fields.get("ENCODE_HOST", "")
    # "localhost (127.0.0.1)" by default, "127.0.0.1" with -N
    in_parens = re.search(r"\(([^()]*)\)\s*$", host)
    host_address = in_parens.group(1) if in_parens else host
    return MungeCredential(
        status=status,
        status_text=status_text,
        encode_host=host_address,
        encoded_at=_epoch(fields["ENCODE_TIME"], "ENCODE_TIME"),
        decoded_at=_epoch(fields["DECODE_TIME"], "DECODE_TIME"),
        ttl_seconds=_int(fields["TTL"], "TTL"),
        uid=uid,
        gid=gid,
        payload=payload,
        user_name=user,
        group_name=group,
    )


def _number_and_name(value: str, key: str) -> tuple[int, str]:
    match = _NUMBER_IN_PARENS.search(value)
    if match:
        return int(match.group(1)), value[: match.start()].strip()
    return _int(value, key), ""


def _epoch(value: str, key: str) -> datetime:
    number, _ = _number_and_name(value, key)
    return datetime.fromtimestamp(number, UTC)


def _int(value: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ParseError(f"unmunge {key} is not a number: {value!r}") from None


def _first_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[0] if lines else ""


def check_request(
    credential: MungeCredential, method: str, path: str, now: datetime, max_age_seconds: int
) -> BoundRequest:
    """CREDENTIAL is good for this request at NOW: its payload names METHOD and PATH (the
    request's target: its path and query string) with a nonce, and it was encoded at most MAX_AGE_SECONDS ago (and not in the future, beyond the
    clock skew allowed). Raises CredentialInvalid or CredentialExpired."""
    bound = parse_payload(credential.payload)
    if bound.method != method or bound.path != path:
        raise CredentialInvalid(f"credential is for {bound.method} {bound.path}, not {method} {path}")
    age = (now - credential.encoded_at).total_seconds()
    if age < -MAX_CLOCK_SKEW_SECONDS:
        raise CredentialExpired(f"credential encoded {-age:.0f} s in the future (clock skew)")
    if age > max_age_seconds:
        raise CredentialExpired(f"credential encoded {age:.0f} s ago, over {max_age_seconds} s")
    return bound


def credential_from_header(value: str | None) -> str | None:
    """The credential of an `Authorization: MUNGE <credential>` header, else None."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    if scheme.upper() != AUTH_SCHEME:
        return None
    return rest.strip()
