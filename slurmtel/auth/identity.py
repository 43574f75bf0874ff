"""Who is asking: one function, `authenticate`, for every HTTP server of slurmtel (DESIGN §8).

Framework-independent: the server hands over a `RequestView` (method, path, headers, peer
address), the settings and the clock, and gets back the caller's `slurmtel.access.Identity`
(role and coordinated accounts resolved as for the CLI's unix user) or a `Denied` with the
HTTP status to answer. Deny by default: a request without a credential of an enabled method,
with two credentials, or with one that fails any check is denied; a presented credential
that fails never falls through to a weaker method.

Methods, tried in the order of `api.auth_methods`:
- "munge": `Authorization: MUNGE <credential>` whose payload is "METHOD TARGET NONCE" of this
  request (TARGET: the path and its query string; munge.py), decoded by the server's munged,
  fresh, and never seen before (replay.py; a user's share of it bounded);
  the uid becomes a user name through the server's passwd (pwd).
- "jwt": Slurm's token as slurmrestd takes it (`X-SLURM-USER-TOKEN`, or `Authorization:
  Bearer`), HS256 with the site's key (jwt.py); `sun` is the user. An `X-SLURM-USER-NAME` other
  than `sun` is refused (no impersonation).
- "proxy": the configured user header, believed only from a trusted proxy address (proxy.py).
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http import HTTPStatus

from slurmtel.access import Identity, Role
from slurmtel.auth import jwt, munge, proxy
from slurmtel.auth.replay import ReplayCache, Verdict
from slurmtel.config import AccessConfig, Config
from slurmtel.errors import AuthenticationFailed, AuthUnavailable

JWT_TOKEN_HEADER = "X-SLURM-USER-TOKEN"
JWT_USER_HEADER = "X-SLURM-USER-NAME"


@dataclass(frozen=True)
class RequestView:
    """What authentication needs of an HTTP request, whatever server received it."""

    method: str
    # the path without the query string
    path: str
    # (name, value) pairs as received; names compare case-insensitively
    headers: tuple[tuple[str, str], ...]
    # the TCP peer's address as the socket reports it
    peer_address: str
    # the query string as received (after "?", not decoded); "" = none
    query: str = ""

    @property
    def target(self) -> str:
        """What a MUNGE credential is bound to: the path, and the query string when there is one."""
        return f"{self.path}?{self.query}" if self.query else self.path

    @classmethod
    def of(
        cls, method: str, target: str, headers: Mapping[str, str] | object, peer_address: str
    ) -> RequestView:
        """From a request line's target and an `http.server` header object (an
        email.message.Message, which keeps repeated headers) or a plain mapping."""
        items = headers.items() if hasattr(headers, "items") else ()
        path, _, query = target.partition("?")
        return cls(method.upper(), path, tuple((str(k), str(v)) for k, v in items), peer_address, query)

    def header_values(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]


@dataclass(frozen=True)
class Denied:
    reason: str
    # 401: no or bad credential; 403: a known caller who may not; 503: cannot check now
    status: int = HTTPStatus.UNAUTHORIZED
    # the method whose credential was refused ("" when none was presented)
    method: str = ""


def _no_coordinators(user: str) -> frozenset[str]:
    return frozenset()


@dataclass(frozen=True)
class AuthSettings:
    """Everything `authenticate` needs besides the request and the clock."""

    methods: tuple[str, ...] = ("munge",)
    access: AccessConfig = field(default_factory=AccessConfig)
    munge_socket: str = ""
    credential_ttl_seconds: int = 60
    jwt_key: bytes = b""
    trusted_proxies: tuple[proxy.Network, ...] = ()
    proxy_user_header: str = "X-Remote-User"
    # shared by every request of one server (state, not a setting: not compared)
    replay_cache: ReplayCache = field(default_factory=ReplayCache, compare=False)
    # user -> accounts they coordinate (with sub-accounts); the read API passes
    # slurmtel.commands.common.coordinated_accounts; the default grants none (deny by default)
    coordinators: Callable[[str], frozenset[str]] = field(default=_no_coordinators, compare=False)
    # the unmunge program (a path when it is not on PATH)
    unmunge_command: str = "unmunge"

    @classmethod
    def from_config(
        cls, config: Config, coordinators: Callable[[str], frozenset[str]] = _no_coordinators
    ) -> AuthSettings:
        """From [api] and [access]; reads the JWT key file once (ConfigError when unusable)."""
        api = config.api
        return cls(
            methods=tuple(api.auth_methods),
            access=config.access,
            munge_socket=api.munge_socket,
            credential_ttl_seconds=api.credential_ttl_seconds,
            jwt_key=jwt.load_key(api.jwt_key_file) if "jwt" in api.auth_methods else b"",
            trusted_proxies=proxy.parse_networks(api.trusted_proxies),
            proxy_user_header=api.proxy_user_header,
            replay_cache=ReplayCache(
                api.replay_cache_entries, min(api.replay_cache_entries_per_user, api.replay_cache_entries)
            ),
            coordinators=coordinators,
        )


def identity_for(
    user: str, uid: int | None, access: AccessConfig, coordinators: Callable[[str], frozenset[str]]
) -> Identity:
    """The role of USER as the CLI resolves it: root (uid 0) and access.admins are admins,
    access.finance finance, everyone else a user with the accounts they coordinate."""
    if uid == 0 or user in access.admins:
        return Identity(user, Role.ADMIN)
    if user in access.finance:
        return Identity(user, Role.FINANCE)
    return Identity(user, Role.USER, coordinators(user))


def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _single(request: RequestView, name: str) -> str | Denied | None:
    values = request.header_values(name)
    if len(values) > 1:
        return Denied(f"{name} given {len(values)} times")
    return values[0] if values else None


def verify_munge(
    request: RequestView,
    credential: str,
    now: datetime,
    *,
    socket: str,
    max_age_seconds: int,
    replay_cache: ReplayCache,
    unmunge_command: str = "unmunge",
) -> munge.MungeCredential | Denied:
    """A MUNGE credential good for exactly this request, once; or why not. Used by
    `authenticate` and by the daemon's POST /v1/job-ended (which checks the uid itself)."""
    # cheapest first: a credential remembered as used is refused without asking munged
    if replay_cache.seen(credential, now):
        return Denied("munge: credential replayed (used before)", HTTPStatus.UNAUTHORIZED, "munge")
    try:
        decoded = munge.decode_credential(credential, socket or None, command=unmunge_command)
        bound = munge.check_request(decoded, request.method, request.target, now, max_age_seconds)
    except AuthUnavailable as exc:
        return Denied(f"munge: cannot check the credential: {exc}", HTTPStatus.SERVICE_UNAVAILABLE, "munge")
    except AuthenticationFailed as exc:
        return Denied(f"munge: {exc}", HTTPStatus.UNAUTHORIZED, "munge")
    # remembered for as long as this server would take it (its age limit and the skew it
    # allows), not munged's expiry: the client chooses that one (munge -t 3600)
    until = decoded.encoded_at + timedelta(seconds=max_age_seconds + munge.MAX_CLOCK_SKEW_SECONDS)
    keys = (credential, f"munge-nonce:{decoded.uid}:{bound.nonce}")
    owner = f"uid {decoded.uid}"
    verdict = replay_cache.first_use(keys, until, now, owner=owner)
    if verdict is Verdict.REPLAYED:
        return Denied("munge: credential replayed (used before)", HTTPStatus.UNAUTHORIZED, "munge")
    if verdict is Verdict.OWNER_FULL:
        window = max_age_seconds + munge.MAX_CLOCK_SKEW_SECONDS
        return Denied(
            f"munge: {owner} sent more than {replay_cache.max_per_owner} requests in {window} s; "
            "its requests are refused until older ones age out (other users are not)",
            HTTPStatus.TOO_MANY_REQUESTS,
            "munge",
        )
    if verdict is Verdict.FULL:
        return Denied(
            "munge: the server's replay cache is full of live credentials; try again shortly",
            HTTPStatus.SERVICE_UNAVAILABLE,
            "munge",
        )
    return decoded


def _munge(request: RequestView, settings: AuthSettings, now: datetime) -> Identity | Denied | None:
    header = _single(request, "Authorization")
    if isinstance(header, Denied):
        return header
    credential = munge.credential_from_header(header)
    if credential is None:
        return None
    decoded = verify_munge(
        request,
        credential,
        now,
        socket=settings.munge_socket,
        max_age_seconds=settings.credential_ttl_seconds,
        replay_cache=settings.replay_cache,
        unmunge_command=settings.unmunge_command,
    )
    if isinstance(decoded, Denied):
        return decoded
    try:
        user = pwd.getpwuid(decoded.uid).pw_name
    except KeyError:
        return Denied(f"munge: uid {decoded.uid} has no user name here", HTTPStatus.FORBIDDEN, "munge")
    return identity_for(user, decoded.uid, settings.access, settings.coordinators)


def _jwt(request: RequestView, settings: AuthSettings, now: datetime) -> Identity | Denied | None:
    token = _single(request, JWT_TOKEN_HEADER)
    if isinstance(token, Denied):
        return token
    if token is None:
        header = _single(request, "Authorization")
        if isinstance(header, Denied):
            return header
        scheme, _, rest = (header or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = rest.strip()
    try:
        claims = jwt.verify_token(token, settings.jwt_key, now)
        # each token is for one caller, but a token is good many times until it expires (as
        # in Slurm): the replay cache does not apply
    except AuthenticationFailed as exc:
        return Denied(f"jwt: {exc}", HTTPStatus.UNAUTHORIZED, "jwt")
    named = _single(request, JWT_USER_HEADER)
    if isinstance(named, Denied):
        return named
    if named is not None and named != claims.user:
        return Denied(
            f"jwt: {JWT_USER_HEADER} {named!r} is not the token's user", HTTPStatus.FORBIDDEN, "jwt"
        )
    return identity_for(claims.user, _uid_of(claims.user), settings.access, settings.coordinators)


def _proxy(request: RequestView, settings: AuthSettings, now: datetime) -> Identity | Denied | None:
    user = _single(request, settings.proxy_user_header)
    if user is None or isinstance(user, Denied):
        return user
    if not proxy.peer_in(request.peer_address, settings.trusted_proxies):
        # anyone can send the header; only a trusted proxy's counts
        return Denied(
            f"proxy: {settings.proxy_user_header} from {request.peer_address}, not a trusted proxy",
            HTTPStatus.UNAUTHORIZED,
            "proxy",
        )
    if not proxy.valid_user_name(user):
        return Denied(
            f"proxy: {settings.proxy_user_header} is not a user name", HTTPStatus.UNAUTHORIZED, "proxy"
        )
    return identity_for(user, _uid_of(user), settings.access, settings.coordinators)


_METHODS: dict[str, Callable[[RequestView, AuthSettings, datetime], Identity | Denied | None]] = {
    "munge": _munge,
    "jwt": _jwt,
    "proxy": _proxy,
}


def authenticate(request: RequestView, settings: AuthSettings, now: datetime) -> Identity | Denied:
    """The caller of REQUEST at NOW (an aware datetime), or why not.

    Each enabled method in order looks for its credential; the first method that finds one
    decides (a bad credential is denied, never tried as another method). No credential of an
    enabled method: Denied 401."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    for name in settings.methods:
        method = _METHODS.get(name)
        if method is None:
            return Denied(f"unknown authentication method {name!r}", HTTPStatus.INTERNAL_SERVER_ERROR)
        result = method(request, settings, now)
        if result is not None:
            return result
    return Denied(f"no credential (methods: {', '.join(settings.methods) or 'none'})")
