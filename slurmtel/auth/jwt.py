"""Slurm's JSON Web Tokens (`scontrol token`, AuthAltTypes=auth/jwt), verified with the
site's HS256 key (`jwt_hs256.key`, used byte for byte as Slurm uses it).

Stdlib only (hmac, hashlib, base64, json). Only HS256 is accepted: the algorithm named in
the token's header is checked against it, never used to pick one (an `alg: none` or RS256
token is refused before any signature is looked at). Claims as slurmctld issues them: `sun`
the user name, `exp` the expiry, `iat` the issue time (epoch seconds).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from slurmtel.errors import ConfigError, CredentialExpired, CredentialInvalid

ALGORITHM = "HS256"
# a token issued this far after the server's clock is refused (two hosts' clocks differ)
MAX_CLOCK_SKEW_SECONDS = 30
MAX_TOKEN_CHARS = 8192
_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")
# Slurm's user names are unix names
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True)
class JwtClaims:
    user: str
    issued_at: datetime
    expires_at: datetime


def load_key(path: str | os.PathLike[str]) -> bytes:
    """The HS256 key file's bytes. ConfigError when unreadable, empty, or readable or writable by
    others (anyone who can read it can mint tokens for any user)."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        key = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"JWT key file {file}: cannot read: {exc.strerror}") from exc
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise ConfigError(f"JWT key file {file}: mode {stat.S_IMODE(mode):04o} lets others read or write it")
    if not key:
        raise ConfigError(f"JWT key file {file} is empty")
    return key


def _b64decode(segment: str) -> bytes:
    if not _SEGMENT.fullmatch(segment):
        raise CredentialInvalid("token is not base64url")
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise CredentialInvalid("token is not base64url") from None


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise CredentialInvalid(f"token {what} is not JSON") from None
    if not isinstance(value, dict):
        raise CredentialInvalid(f"token {what} is not a JSON object")
    return value


def _epoch_claim(claims: dict[str, Any], name: str) -> datetime:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CredentialInvalid(f"token has no numeric '{name}' claim")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise CredentialInvalid(f"token '{name}' is out of range") from None


def verify_token(token: str, key: bytes, now: datetime) -> JwtClaims:
    """The claims of TOKEN when it is an HS256 token signed with KEY, not expired at NOW and
    not issued in the future. CredentialInvalid or CredentialExpired otherwise."""
    if not key:
        raise CredentialInvalid("no JWT key")
    if len(token) > MAX_TOKEN_CHARS:
        raise CredentialInvalid("token too long")
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise CredentialInvalid("not a JWT (header.payload.signature)")
    header_b64, payload_b64, signature_b64 = parts
    header = _json_object(_b64decode(header_b64), "header")
    if header.get("alg") != ALGORITHM:
        raise CredentialInvalid(f"token algorithm {header.get('alg')!r} is not {ALGORITHM}")
    expected = hmac.new(key, f"{header_b64}.{payload_b64}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, _b64decode(signature_b64)):
        raise CredentialInvalid("token signature does not match the key")
    claims = _json_object(_b64decode(payload_b64), "payload")
    expires_at = _epoch_claim(claims, "exp")
    issued_at = _epoch_claim(claims, "iat")
    user = claims.get("sun")
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise CredentialInvalid("token has no valid 'sun' (user name) claim")
    if expires_at <= now:
        raise CredentialExpired(f"token expired at {expires_at.isoformat()}")
    if issued_at > now + timedelta(seconds=MAX_CLOCK_SKEW_SECONDS):
        raise CredentialInvalid(f"token issued in the future ({issued_at.isoformat()})")
    return JwtClaims(user=user, issued_at=issued_at, expires_at=expires_at)


def make_token(key: bytes, user: str, issued_at: datetime, lifespan_seconds: int) -> str:
    """An HS256 token as `scontrol token username=USER lifespan=N` makes it (tests, tools)."""
    header = _b64encode(json.dumps({"alg": ALGORITHM, "typ": "JWT"}, separators=(",", ":")).encode())
    iat = int(issued_at.timestamp())
    claims = {"exp": iat + lifespan_seconds, "iat": iat, "sun": user}
    payload = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64encode(signature)}"
