"""MUNGE authentication against real munged daemons the session starts (tests/munge_lab.py):
one with its own key (the "site"), a second sharing that key (another head), and a third
with another key (another site). Credentials are made with the real `munge` command, as
ourselves and, through `runuser`, as two throwaway unix users made with `useradd`."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path

import pytest

from slurmtel.access import Identity, Role
from slurmtel.auth import munge
from slurmtel.auth.identity import AuthSettings, Denied, RequestView, authenticate
from slurmtel.auth.replay import ReplayCache
from slurmtel.config import AccessConfig
from slurmtel.errors import AuthUnavailable, CredentialInvalid, CredentialReplayed
from tests import munge_lab

PATH = "/v1/usage"


@pytest.fixture(scope="session")
def site() -> Iterator[munge_lab.Munged]:
    munge_lab.ensure_munge()
    with munge_lab.running() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def same_key(site: munge_lab.Munged) -> Iterator[munge_lab.Munged]:
    with munge_lab.running(key_from=site) as daemon:
        yield daemon


@pytest.fixture(scope="session")
def other_site(site: munge_lab.Munged) -> Iterator[munge_lab.Munged]:
    with munge_lab.running() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def users(site: munge_lab.Munged) -> Iterator[tuple[str, str]]:
    """Two throwaway unix users (root only: useradd, runuser)."""
    munge_lab.require_root("credentials of other users")
    made = [munge_lab.add_user(), munge_lab.add_user()]
    yield made[0], made[1]
    for name in made:
        munge_lab.remove_user(name)


ME = pwd.getpwuid(os.getuid()).pw_name


def settings(site: munge_lab.Munged, **overrides: object) -> AuthSettings:
    base: dict[str, object] = {
        "methods": ("munge",),
        "munge_socket": site.socket,
        "credential_ttl_seconds": 60,
        "access": AccessConfig(admins=[], finance=[]),
        "unmunge_command": munge_lab.tool("unmunge"),
        "replay_cache": ReplayCache(),
    }
    base.update(overrides)
    return AuthSettings(**base)  # type: ignore[arg-type]


def request(credential: str, method: str = "GET", path: str = PATH, peer: str = "127.0.0.1") -> RequestView:
    return RequestView(method, path, (("Authorization", f"MUNGE {credential}"),), peer)


def now() -> datetime:
    return datetime.now(UTC)


def bound(method: str = "GET", path: str = PATH) -> str:
    return munge.request_payload(method, path, munge.new_nonce()).decode()


def test_encode_and_decode_with_the_library(site: munge_lab.Munged) -> None:
    payload = munge.request_payload("GET", PATH, munge.new_nonce())
    credential = munge.encode_credential(payload, site.socket, command=munge_lab.tool("munge"))
    decoded = munge.decode_credential(credential, site.socket, command=munge_lab.tool("unmunge"))
    assert decoded.uid == os.getuid() and decoded.gid == os.getgid()
    assert decoded.payload == payload and decoded.status == 0
    assert abs((decoded.encoded_at - now()).total_seconds()) < 60
    # munged's own replay check
    with pytest.raises(CredentialReplayed):
        munge.decode_credential(credential, site.socket, command=munge_lab.tool("unmunge"))
    # -n: no payload
    empty = munge.encode_credential(b"", site.socket, ttl_seconds=10, command=munge_lab.tool("munge"))
    assert munge.decode_credential(empty, site.socket, command=munge_lab.tool("unmunge")).ttl_seconds == 10


def test_a_valid_credential_is_the_caller(site: munge_lab.Munged) -> None:
    credential = site.credential(bound())
    result = authenticate(request(credential), settings(site), now())
    role = Role.ADMIN if os.getuid() == 0 else Role.USER
    assert result == Identity(ME, role)
    # what a client sends, made by the library: good for this request once
    header = munge.authorization_header(
        "GET", PATH + "?month=2026-11", site.socket, command=munge_lab.tool("munge")
    )
    view = RequestView("GET", PATH, (("Authorization", header),), "127.0.0.1", "month=2026-11")
    conf = settings(site)
    assert authenticate(view, conf, now()) == Identity(ME, role)
    assert isinstance(authenticate(view, conf, now()), Denied)


def test_a_credential_covers_the_query_string(site: munge_lab.Munged) -> None:
    """A credential for one query is no good for another, nor for the path without it (the
    red team changed ?user= of a captured request)."""
    conf = settings(site)
    for sent, bound_to in (
        ("month=2026-10", "month=2026-11"),
        ("", "month=2026-11"),
        ("month=2026-11", ""),
        ("month=2026-11&user=bob", "month=2026-11"),
    ):
        credential = site.credential(bound("GET", PATH + (f"?{bound_to}" if bound_to else "")))
        view = RequestView("GET", PATH, (("Authorization", f"MUNGE {credential}"),), "127.0.0.1", sent)
        result = authenticate(view, conf, now())
        assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED, (sent, bound_to)
        assert "credential is for" in result.reason
    credential = site.credential(bound("GET", PATH + "?month=2026-11&top=5"))
    view = RequestView(
        "GET", PATH, (("Authorization", f"MUNGE {credential}"),), "127.0.0.1", "month=2026-11&top=5"
    )
    assert isinstance(authenticate(view, conf, now()), Identity)


def test_a_credential_is_remembered_only_as_long_as_the_server_takes_it(site: munge_lab.Munged) -> None:
    """munge -t 3600: munged would take it for an hour, the server for its own 60 s (+ the
    skew it allows); the replay cache holds it that long, not an hour."""
    conf = settings(site, credential_ttl_seconds=60)
    credential = site.credential(bound(), ttl_seconds=3600)
    at = now()
    assert isinstance(authenticate(request(credential), conf, at), Identity)
    cache = conf.replay_cache
    assert cache.seen(credential, at + timedelta(seconds=60))
    assert not cache.seen(credential, at + timedelta(seconds=60 + munge.MAX_CLOCK_SKEW_SECONDS + 2))
    # past that, the entry is gone and so is the owner's count of it
    cache.first_use(("later",), at + timedelta(seconds=500), at + timedelta(seconds=200), owner="uid 1")
    assert len(cache) == 1 and cache.held_by(f"uid {os.getuid()}") == 0


def test_one_user_filling_their_share_locks_out_only_themselves(
    site: munge_lab.Munged, users: tuple[str, str]
) -> None:
    alice, bob = users
    conf = settings(site, replay_cache=ReplayCache(max_entries=100, max_per_owner=6))
    # each accepted credential holds two entries (the credential and its nonce): 3 requests
    for _ in range(3):
        assert isinstance(authenticate(request(site.credential(bound(), user=alice)), conf, now()), Identity)
    refused = authenticate(request(site.credential(bound(), user=alice)), conf, now())
    assert isinstance(refused, Denied) and refused.status == HTTPStatus.TOO_MANY_REQUESTS
    uid = pwd.getpwnam(alice).pw_uid
    assert (
        f"uid {uid} sent more than 6 requests" in refused.reason and "other users are not" in refused.reason
    )
    # bob is served all the while
    for _ in range(3):
        assert isinstance(authenticate(request(site.credential(bound(), user=bob)), conf, now()), Identity)
    # her share frees itself as her credentials age out (60 s + skew): then she is taken again
    cache = conf.replay_cache
    assert cache.held_by(f"uid {uid}") == 6
    later = now() + timedelta(seconds=60 + munge.MAX_CLOCK_SKEW_SECONDS + 1)
    assert cache.first_use(("next",), later + timedelta(seconds=60), later, owner=f"uid {uid}")
    assert cache.held_by(f"uid {uid}") == 1


def test_other_unix_users_map_to_their_names_and_roles(
    site: munge_lab.Munged, users: tuple[str, str]
) -> None:
    alice, bob = users
    access = AccessConfig(admins=[], finance=[bob])
    conf = settings(
        site, access=access, coordinators=lambda u: frozenset({"physics"}) if u == alice else frozenset()
    )
    as_alice = authenticate(request(site.credential(bound(), user=alice)), conf, now())
    assert as_alice == Identity(alice, Role.USER, frozenset({"physics"}))
    as_bob = authenticate(request(site.credential(bound(), user=bob)), conf, now())
    assert as_bob == Identity(bob, Role.FINANCE)
    # the uid is what munged says, not a name the client could choose
    assert (
        munge.decode_credential(
            site.credential(bound(), user=alice), site.socket, command=munge_lab.tool("unmunge")
        ).uid
        == pwd.getpwnam(alice).pw_uid
    )


def test_a_replayed_credential_is_denied(site: munge_lab.Munged, same_key: munge_lab.Munged) -> None:
    conf = settings(site)
    credential = site.credential(bound())
    assert isinstance(authenticate(request(credential), conf, now()), Identity)
    again = authenticate(request(credential), conf, now())
    assert (
        isinstance(again, Denied) and again.status == HTTPStatus.UNAUTHORIZED and "replayed" in again.reason
    )
    # another munged with the same key (another head) never saw it: munged alone takes it again
    credential = site.credential(bound())
    assert isinstance(authenticate(request(credential), conf, now()), Identity)
    assert isinstance(authenticate(request(credential), settings(same_key), now()), Identity)
    # ... our replay cache, shared by both, does not
    elsewhere = settings(same_key, replay_cache=conf.replay_cache)
    credential = site.credential(bound())
    assert isinstance(authenticate(request(credential), conf, now()), Identity)
    replayed = authenticate(request(credential), elsewhere, now())
    assert isinstance(replayed, Denied) and "replayed" in replayed.reason


def test_garbled_and_tampered_credentials_are_denied(site: munge_lab.Munged) -> None:
    conf = settings(site)
    good = site.credential(bound())
    tampered = good[:40] + ("B" if good[40] == "A" else "A") + good[41:]
    for credential in ("MUNGE:garbage:", tampered, good[:-10] + ":", "not-munge", ""):
        result = authenticate(request(credential), conf, now())
        assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED, credential
    with pytest.raises(CredentialInvalid, match="Invalid credential"):
        munge.decode_credential(tampered, site.socket, command=munge_lab.tool("unmunge"))


def test_a_credential_for_another_method_or_path_is_denied(site: munge_lab.Munged) -> None:
    conf = settings(site)
    for method, path in (("POST", PATH), ("GET", "/v1/jobs"), ("GET", PATH + "/")):
        result = authenticate(request(site.credential(bound(method, path))), conf, now())
        assert isinstance(result, Denied) and "not GET /v1/usage" in result.reason, (method, path)
    # no binding at all (munge -n, or a payload of another shape)
    for payload in ("", "GET /v1/usage", "hello"):
        result = authenticate(request(site.credential(payload)), conf, now())
        assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED, payload


def test_a_credential_from_another_key_is_denied(
    site: munge_lab.Munged, other_site: munge_lab.Munged
) -> None:
    result = authenticate(request(other_site.credential(bound())), settings(site), now())
    assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED
    assert "Invalid credential" in result.reason


def test_expiry_is_checked_against_the_injected_clock(site: munge_lab.Munged) -> None:
    conf = settings(site, credential_ttl_seconds=60)
    credential = site.credential(bound())
    encoded = munge.decode_credential(credential, site.socket, command=munge_lab.tool("unmunge")).encoded_at
    # decoded above by munged once: a second munged decode is a replay, so each case gets its own
    late = authenticate(request(site.credential(bound())), conf, encoded + timedelta(seconds=3600))
    assert isinstance(late, Denied) and late.status == HTTPStatus.UNAUTHORIZED
    assert "s ago, over 60 s" in late.reason
    early = authenticate(request(site.credential(bound())), conf, encoded - timedelta(seconds=3600))
    assert isinstance(early, Denied) and "future" in early.reason
    fresh = authenticate(request(site.credential(bound())), conf, now() + timedelta(seconds=59))
    assert isinstance(fresh, Identity)


def test_munged_down_is_a_503_not_a_401(site: munge_lab.Munged, tmp_path: Path) -> None:
    conf = settings(site, munge_socket=str(tmp_path / "no.socket"))
    result = authenticate(request(site.credential(bound())), conf, now())
    assert isinstance(result, Denied) and result.status == HTTPStatus.SERVICE_UNAVAILABLE
    assert "Did you start munged?" in result.reason
    with pytest.raises(AuthUnavailable):
        munge.encode_credential(b"x", str(tmp_path / "no.socket"), command=munge_lab.tool("munge"))
    missing = settings(site, unmunge_command=str(tmp_path / "unmunge"))
    result = authenticate(request(site.credential(bound())), missing, now())
    assert isinstance(result, Denied) and result.status == HTTPStatus.SERVICE_UNAVAILABLE


def test_two_authorization_headers_are_denied(site: munge_lab.Munged) -> None:
    a, b = site.credential(bound()), site.credential(bound())
    view = RequestView("GET", PATH, (("Authorization", f"MUNGE {a}"), ("authorization", f"MUNGE {b}")), "::1")
    result = authenticate(view, settings(site), now())
    assert isinstance(result, Denied) and "2 times" in result.reason
