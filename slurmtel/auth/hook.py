"""Who may tell the head daemon that a job ended (POST /v1/job-ended, the EpilogSlurmctld hook).

A post only moves the next sacct run forward, but unauthenticated it let anyone make the head
hammer slurmdbd. Now a post needs either a MUNGE credential bound to "POST /v1/job-ended
NONCE" whose uid is root or slurm.conf's SlurmUser (`daemon.job_end_users`; slurmctld runs
EpilogSlurmctld as SlurmUser), or the bearer token of `daemon.job_end_token_file`; and, with
`daemon.job_end_peers`, it must come from one of those addresses (the slurmctld hosts).

Cheapest first, so that no unauthenticated peer can take what slurmctld's posts need: each peer
has a token bucket (`daemon.job_end_rate_per_second`, bursts of twice as many); then what needs
no unmunge is decided without one (`screen_hook_request`: the peer list, the header, the bearer
token, the shape of a credential, a credential already used); only then does a post take one of
`MAX_CONCURRENT_CHECKS` slots to run unmunge (`check_hook_credential`). An address whose
credential failed that check (unauthenticated, or another user's) is a suspect for
`PENALTY_SECONDS` (`PeerPenalty`): all suspects share `SUSPECT_CHECKS` slot(s) of their own and
are answered 429 when it is taken, so a flood from many addresses takes one slot, never the ones
slurmctld's posts need. The hook script (systemd/slurmtel-epilog.sh) retries a post that got no
answer, 429 or 5xx, with backoff.
"""

from __future__ import annotations

import contextlib
import hmac
import pwd
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from pathlib import Path

from slurmtel.agent.token import read_token_file
from slurmtel.auth import munge, proxy
from slurmtel.auth.identity import Denied, RequestView, verify_munge
from slurmtel.auth.replay import ReplayCache
from slurmtel.config import Config
from slurmtel.errors import ConfigError

JOB_END_PATH = "/v1/job-ended"
# unmunge processes at once; a post beyond that is answered 503 (the hook retries it)
MAX_CONCURRENT_CHECKS = 8
# an address whose credential failed the check is a suspect this long (since its last failure)
PENALTY_SECONDS = 10.0
# unmunge processes at once for all suspects together (beside MAX_CONCURRENT_CHECKS)
SUSPECT_CHECKS = 1
# peers whose buckets are remembered (the least recently seen are forgotten beyond this)
MAX_TRACKED_PEERS = 4096


@dataclass(frozen=True)
class HookPolicy:
    # uids whose MUNGE credentials may post (root and SlurmUser, resolved when built)
    uids: frozenset[int] = frozenset({0})
    # [] = any address
    peers: tuple[proxy.Network, ...] = ()
    # "" = no token: MUNGE only
    token: str = field(default="", repr=False)
    munge_socket: str = ""
    max_age_seconds: int = 60
    unmunge_command: str = "unmunge"

    @classmethod
    def from_config(cls, config: Config) -> HookPolicy:
        daemon = config.daemon
        uids = set()
        for user in daemon.job_end_users:
            # a SlurmUser that does not exist on this host posts nothing
            with contextlib.suppress(KeyError):
                uids.add(pwd.getpwnam(user).pw_uid)
        token = ""
        if daemon.job_end_token_file:
            path = Path(daemon.job_end_token_file)
            try:
                token = read_token_file(path, "daemon.job_end_token_file")
            except FileNotFoundError as exc:
                raise ConfigError(
                    f"daemon.job_end_token_file: cannot read {daemon.job_end_token_file}: {exc.strerror}"
                ) from exc
        return cls(
            uids=frozenset(uids),
            peers=proxy.parse_networks(daemon.job_end_peers, "daemon.job_end_peers"),
            token=token,
            munge_socket=config.api.munge_socket,
            max_age_seconds=config.api.credential_ttl_seconds,
        )


@dataclass(frozen=True)
class NeedsCheck:
    """A post whose MUNGE credential must be decoded (unmunge) before it is known."""

    credential: str


def screen_hook_request(
    request: RequestView, policy: HookPolicy, replay_cache: ReplayCache, now: datetime
) -> str | Denied | NeedsCheck:
    """What can be said of a job-ended post without running unmunge: who sent it ("token"),
    why it is refused, or that its credential needs the check."""
    if policy.peers and not proxy.peer_in(request.peer_address, policy.peers):
        return Denied(f"{request.peer_address} is not in daemon.job_end_peers", HTTPStatus.FORBIDDEN)
    headers = request.header_values("Authorization")
    if len(headers) != 1:
        return Denied("no credential" if not headers else "Authorization given more than once")
    header = headers[0]
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        if policy.token and hmac.compare_digest(rest.strip().encode(), policy.token.encode()):
            return "token"
        return Denied(
            "wrong bearer token" if policy.token else "no token is configured (daemon.job_end_token_file)"
        )
    credential = munge.credential_from_header(header)
    if credential is None:
        return Denied("no credential")
    if not munge.looks_like_credential(credential):
        return Denied("munge: not a MUNGE credential", method="munge")
    if replay_cache.seen(credential, now):
        return Denied("munge: credential replayed (used before)", method="munge")
    return NeedsCheck(credential)


def check_hook_credential(
    request: RequestView, credential: str, policy: HookPolicy, replay_cache: ReplayCache, now: datetime
) -> str | Denied:
    """Who sent this post ("munge uid 64030") by its MUNGE credential (unmunge), or why not."""
    decoded = verify_munge(
        request,
        credential,
        now,
        socket=policy.munge_socket,
        max_age_seconds=policy.max_age_seconds,
        replay_cache=replay_cache,
        unmunge_command=policy.unmunge_command,
    )
    if isinstance(decoded, Denied):
        return decoded
    if decoded.uid not in policy.uids:
        return Denied(f"uid {decoded.uid} is not in daemon.job_end_users", HTTPStatus.FORBIDDEN, "munge")
    return f"munge uid {decoded.uid}"


def check_hook_request(
    request: RequestView, policy: HookPolicy, replay_cache: ReplayCache, now: datetime
) -> str | Denied:
    """Who sent this job-ended post ("munge uid 64030", "token"), or why it is refused."""
    screened = screen_hook_request(request, policy, replay_cache, now)
    if isinstance(screened, NeedsCheck):
        return check_hook_credential(request, screened.credential, policy, replay_cache, now)
    return screened


class PeerPenalty:
    """Addresses whose last checked credential failed, and until when they are suspects.
    Bounded (the oldest are forgotten beyond MAX_PEERS); thread-safe."""

    def __init__(self, seconds: float = PENALTY_SECONDS, max_peers: int = MAX_TRACKED_PEERS) -> None:
        self.seconds = seconds
        self.max_peers = max_peers
        self._until: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def penalise(self, peer: str, now_seconds: float) -> None:
        with self._lock:
            self._until.pop(peer, None)
            self._until[peer] = now_seconds + self.seconds
            while len(self._until) > self.max_peers:
                self._until.popitem(last=False)

    def clear(self, peer: str) -> None:
        with self._lock:
            self._until.pop(peer, None)

    def active(self, peer: str, now_seconds: float) -> bool:
        with self._lock:
            until = self._until.get(peer)
            if until is None:
                return False
            if until <= now_seconds:
                del self._until[peer]
                return False
            return True


class PeerRateLimit:
    """A token bucket per peer address: RATE per second, up to BURST at once. Thread-safe;
    the clock (monotonic seconds) comes in with each call."""

    def __init__(self, rate_per_second: float, burst: float, max_peers: int = MAX_TRACKED_PEERS) -> None:
        if rate_per_second <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate_per_second
        self.burst = burst
        self.max_peers = max_peers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, peer: str, now_seconds: float) -> bool:
        with self._lock:
            tokens, at = self._buckets.pop(peer, (self.burst, now_seconds))
            tokens = min(self.burst, tokens + max(0.0, now_seconds - at) * self.rate)
            allowed = tokens >= 1
            self._buckets[peer] = (tokens - 1 if allowed else tokens, now_seconds)
            while len(self._buckets) > self.max_peers:
                # forgetting a peer gives it a full bucket again: bounded memory beats that
                self._buckets.popitem(last=False)
            return allowed
