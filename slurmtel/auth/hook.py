"""Who may tell the head daemon that a job ended (POST /v1/job-ended, the EpilogSlurmctld hook).

A post only moves the next sacct run forward, but unauthenticated it let anyone make the head
hammer slurmdbd. Now a post needs either a MUNGE credential bound to "POST /v1/job-ended
NONCE" whose uid is root or slurm.conf's SlurmUser (`daemon.job_end_users`; slurmctld runs
EpilogSlurmctld as SlurmUser), or the bearer token of `daemon.job_end_token_file`; and, with
`daemon.job_end_peers`, it must come from one of those addresses (the slurmctld hosts).

Before any of that, each peer has a token bucket (`daemon.job_end_rate_per_second`, bursts of
twice as many) and at most `MAX_CONCURRENT_CHECKS` credentials are checked at once (each is an
unmunge process): a flood from one address is answered 429 cheaply and cannot starve another.
"""

from __future__ import annotations

import contextlib
import hmac
import pwd
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from pathlib import Path

from slurmtel.auth import munge, proxy
from slurmtel.auth.identity import Denied, RequestView, verify_munge
from slurmtel.auth.replay import ReplayCache
from slurmtel.config import Config
from slurmtel.errors import ConfigError

JOB_END_PATH = "/v1/job-ended"
# unmunge processes at once; a post beyond that is answered 503 (the hook never retries)
MAX_CONCURRENT_CHECKS = 8
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
                mode = path.stat().st_mode
                token = path.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"daemon.job_end_token_file: cannot read {daemon.job_end_token_file}: {exc.strerror}"
                ) from exc
            if mode & (stat.S_IROTH | stat.S_IWOTH):
                raise ConfigError(
                    f"daemon.job_end_token_file: {path} is readable or writable by every user (chmod 0600)"
                )
            if len(token) < 16:
                raise ConfigError("daemon.job_end_token_file: needs a token of at least 16 characters")
        return cls(
            uids=frozenset(uids),
            peers=proxy.parse_networks(daemon.job_end_peers, "daemon.job_end_peers"),
            token=token,
            munge_socket=config.api.munge_socket,
            max_age_seconds=config.api.credential_ttl_seconds,
        )


def check_hook_request(
    request: RequestView, policy: HookPolicy, replay_cache: ReplayCache, now: datetime
) -> str | Denied:
    """Who sent this job-ended post ("munge uid 64030", "token"), or why it is refused."""
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
