"""slurmtel.auth without a munged: unmunge's output parsed from real captures, request binding,
the replay cache, Slurm JWTs made with a key, the trusted-proxy header, and `authenticate`'s
order and deny-by-default for the methods that need no daemon (MUNGE against a real munged:
tests/test_auth_munged.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pwd
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from pathlib import Path

import pytest

from slurmtel.access import Identity, Role
from slurmtel.auth import jwt, munge, proxy
from slurmtel.auth.hook import HookPolicy, PeerRateLimit, check_hook_request
from slurmtel.auth.identity import AuthSettings, Denied, RequestView, authenticate, identity_for
from slurmtel.auth.replay import ReplayCache, Verdict
from slurmtel.config import AccessConfig, config_from_dict
from slurmtel.errors import ConfigError, CredentialExpired, CredentialInvalid, ParseError
from tests.conftest import fixture_path

NOW = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
KEY = b"\x8a" * 16 + b"slurm-jwt-hs256-test-key-0123456789"


def capture(name: str) -> bytes:
    return fixture_path("munge", name).read_bytes()


# ------------------------------------------------------------------ unmunge's output


def test_parse_unmunge_reads_every_field_of_a_real_capture() -> None:
    cred = munge.parse_unmunge(capture("unmunge-success.txt"))
    assert cred.status == 0 and cred.status_text == "Success"
    assert (cred.uid, cred.gid, cred.user_name, cred.group_name) == (0, 0, "root", "root")
    assert cred.encode_host == "127.0.0.1"
    assert cred.encoded_at == datetime.fromtimestamp(1796396238, UTC) == cred.decoded_at
    assert cred.ttl_seconds == 300
    assert cred.expires_at == cred.encoded_at + timedelta(seconds=300)
    assert cred.payload == b"GET /v1/usage 4f2a9c1be07d43a5"


def test_parse_unmunge_reads_the_numeric_form_the_same() -> None:
    named = munge.parse_unmunge(capture("unmunge-success.txt"))
    numeric = munge.parse_unmunge(capture("unmunge-success-numeric.txt"))
    assert (numeric.uid, numeric.gid, numeric.encoded_at, numeric.ttl_seconds, numeric.payload) == (
        named.uid,
        named.gid,
        named.encoded_at,
        named.ttl_seconds,
        named.payload,
    )
    assert numeric.user_name == "" and numeric.encode_host == "127.0.0.1"


def test_parse_unmunge_other_users_no_payload_replayed_and_expired_captures() -> None:
    nobody = munge.parse_unmunge(capture("unmunge-nobody.txt"))
    assert (nobody.uid, nobody.user_name, nobody.gid, nobody.group_name) == (
        65534,
        "nobody",
        65534,
        "nogroup",
    )
    assert munge.parse_unmunge(capture("unmunge-no-payload.txt")).payload == b""
    replayed = munge.parse_unmunge(capture("unmunge-replayed.txt"))
    assert (replayed.status, replayed.status_text) == (17, "Replayed credential")
    expired = munge.parse_unmunge(capture("unmunge-expired.txt"))
    assert (expired.status, expired.ttl_seconds) == (15, 1)
    assert expired.decoded_at - expired.encoded_at == timedelta(seconds=2)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.replace(b"UID:", b"XID:"),
        lambda b: b.replace(b"(1796396238)", b"(soon)"),
        lambda b: b.split(b"\n", 3)[3],
        lambda b: b + b"extra",  # payload longer than LENGTH
        lambda b: b"",
    ],
    ids=["no-uid", "time-not-a-number", "truncated-head", "length-mismatch", "empty"],
)
def test_parse_unmunge_refuses_damaged_output(damage: object) -> None:
    assert callable(damage)
    with pytest.raises(ParseError):
        munge.parse_unmunge(damage(capture("unmunge-success.txt")))


def test_the_stderr_captures_are_what_decode_classifies() -> None:
    # what unmunge said, kept so the messages the server passes on are real ones
    assert capture("unmunge-garbled.stderr").startswith(b"unmunge: Error: Failed to base64-decode")
    assert capture("unmunge-tampered.stderr") == capture("unmunge-other-key.stderr")
    assert b"Did you start munged?" in capture("unmunge-no-daemon.stderr")


# ------------------------------------------------------------------ binding a credential to a request


def test_request_payload_round_trips_and_refuses_what_could_be_misread() -> None:
    payload = munge.request_payload("POST", "/v1/job-ended", "9c1be07d43a54f2a")
    assert payload == b"POST /v1/job-ended 9c1be07d43a54f2a"
    assert munge.parse_payload(payload) == munge.BoundRequest("POST", "/v1/job-ended", "9c1be07d43a54f2a")
    for method, path, nonce in [
        ("post", "/v1/x", "9c1be07d43a54f2a"),
        ("GET", "/v1/x y", "9c1be07d43a54f2a"),
        ("GET", "v1/x", "9c1be07d43a54f2a"),
        ("GET", "/v1/x", "short"),
        ("GET", "/v1/x", "9c1be07d43a54f2a 1"),
    ]:
        with pytest.raises(ValueError):
            munge.request_payload(method, path, nonce)
    for payload in (b"", b"GET /v1/x", b"GET /v1/x 9c1be07d43a54f2a extra", b"GET /v1/\xff 9c1be07d43a54f2a"):
        with pytest.raises(CredentialInvalid):
            munge.parse_payload(payload)
    assert len(munge.new_nonce()) == 32 and munge.new_nonce() != munge.new_nonce()


def test_check_request_binds_method_path_and_age_with_an_injected_clock() -> None:
    cred = munge.parse_unmunge(capture("unmunge-success.txt"))
    at = cred.encoded_at
    assert (
        munge.check_request(cred, "GET", "/v1/usage", at + timedelta(seconds=60), 60).nonce
        == "4f2a9c1be07d43a5"
    )
    with pytest.raises(CredentialInvalid, match="not POST /v1/usage"):
        munge.check_request(cred, "POST", "/v1/usage", at, 60)
    with pytest.raises(CredentialInvalid, match="not GET /v1/jobs"):
        munge.check_request(cred, "GET", "/v1/jobs", at, 60)
    with pytest.raises(CredentialExpired, match="61 s ago"):
        munge.check_request(cred, "GET", "/v1/usage", at + timedelta(seconds=61), 60)
    with pytest.raises(CredentialExpired, match="future"):
        munge.check_request(cred, "GET", "/v1/usage", at - timedelta(seconds=31), 60)
    # a credential without the payload binding (munge -n) is good for no request
    with pytest.raises(CredentialInvalid):
        munge.check_request(munge.parse_unmunge(capture("unmunge-no-payload.txt")), "GET", "/", at, 60)


def test_credential_from_header_takes_only_the_munge_scheme() -> None:
    assert munge.credential_from_header("MUNGE MUNGE:AwQ=:") == "MUNGE:AwQ=:"
    assert munge.credential_from_header("munge  MUNGE:AwQ=: ") == "MUNGE:AwQ=:"
    assert munge.credential_from_header("Bearer MUNGE:AwQ=:") is None
    assert munge.credential_from_header(None) is None


def test_decode_refuses_what_is_not_a_credential_before_running_unmunge() -> None:
    # the command does not exist: only a well-formed credential would reach it
    for text in ("", "MUNGE:", "MUNGE:abc", "MUNGE:a b:", "MUNGE:" + "A" * 9000 + ":", "--help"):
        with pytest.raises(CredentialInvalid):
            munge.decode_credential(text, command="/nonexistent/unmunge")


# ------------------------------------------------------------------ replay cache


def test_the_replay_cache_bounds_each_owner_as_well_as_the_whole() -> None:
    cache = ReplayCache(max_entries=5, max_per_owner=2)
    until = NOW + timedelta(seconds=60)
    assert cache.first_use(("a1", "a2"), until, NOW, owner="uid 1") is Verdict.FIRST
    # uid 1's share is full: uid 1 is refused, nobody else
    assert cache.first_use(("a3",), until, NOW, owner="uid 1") is Verdict.OWNER_FULL
    assert cache.first_use(("b1", "b2"), until, NOW, owner="uid 2") is Verdict.FIRST
    assert cache.first_use(("c1",), until, NOW, owner="uid 3") is Verdict.FIRST
    # the whole cache full of live entries: refused for everyone (fails closed)
    assert cache.first_use(("d1",), until, NOW, owner="uid 4") is Verdict.FULL
    assert cache.first_use(("a1",), until, NOW, owner="uid 4") is Verdict.REPLAYED
    assert (cache.owner_refusals, cache.full_refusals) == (1, 1)
    assert cache.seen("b2", NOW) and not cache.seen("zz", NOW)
    # expired entries free their owner's share
    later = until + timedelta(seconds=1)
    assert cache.first_use(("a3",), later + timedelta(seconds=60), later, owner="uid 1") is Verdict.FIRST
    assert cache.held_by("uid 1") == 1 and len(cache) == 1
    assert not cache.seen("b2", later)


def test_the_replay_cache_takes_a_key_once_until_it_expires() -> None:
    cache = ReplayCache(max_entries=3)
    until = NOW + timedelta(seconds=60)
    assert cache.first_use(("a",), until, NOW)
    assert not cache.first_use(("a",), until, NOW + timedelta(seconds=59))
    # one of several keys seen is a replay (the same nonce in another credential)
    assert not cache.first_use(("b", "a"), until, NOW)
    assert cache.first_use(("b", "c"), until, NOW)
    # full of live entries: refused, not forgotten
    assert not cache.first_use(("d",), until, NOW)
    assert cache.full_refusals == 1
    # once they expire they are purged and the space is free again
    later = until + timedelta(seconds=1)
    assert cache.first_use(("d",), later + timedelta(seconds=60), later)
    assert len(cache) == 1


# ------------------------------------------------------------------ Slurm JWT


def _segment(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def _signed(header: object, claims: object, key: bytes = KEY) -> str:
    signing = f"{_segment(header)}.{_segment(claims)}"
    signature = hmac.new(key, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def test_a_token_made_with_the_key_gives_its_user() -> None:
    token = jwt.make_token(KEY, "alice", NOW - timedelta(seconds=10), 1800)
    claims = jwt.verify_token(token, KEY, NOW)
    assert claims == jwt.JwtClaims("alice", NOW - timedelta(seconds=10), NOW + timedelta(seconds=1790))
    # the same as a token signed independently of make_token, as slurmctld signs it
    iat = int(NOW.timestamp())
    other = _signed({"alg": "HS256", "typ": "JWT"}, {"exp": iat + 60, "iat": iat, "sun": "bob"})
    assert jwt.verify_token(other, KEY, NOW).user == "bob"


def test_forged_and_malformed_tokens_are_refused() -> None:
    iat = int(NOW.timestamp())
    claims = {"exp": iat + 600, "iat": iat, "sun": "alice"}
    good = _signed({"alg": "HS256", "typ": "JWT"}, claims)
    header, payload, signature = good.split(".")
    tampered = _segment({**claims, "sun": "root"})
    cases = {
        "forged signature": _signed({"alg": "HS256"}, claims, key=b"another key"),
        "alg none": f"{_segment({'alg': 'none', 'typ': 'JWT'})}.{payload}.",
        "alg none, signature kept": f"{_segment({'alg': 'none'})}.{payload}.{signature}",
        "alg HS512": _signed({"alg": "HS512"}, claims),
        "alg RS256": _signed({"alg": "RS256"}, claims),
        "tampered payload": f"{header}.{tampered}.{signature}",
        "missing sun": _signed({"alg": "HS256"}, {"exp": iat + 600, "iat": iat}),
        "sun not a name": _signed({"alg": "HS256"}, {**claims, "sun": "../etc"}),
        "missing exp": _signed({"alg": "HS256"}, {"iat": iat, "sun": "alice"}),
        "missing iat": _signed({"alg": "HS256"}, {"exp": iat + 600, "sun": "alice"}),
        "exp a string": _signed({"alg": "HS256"}, {**claims, "exp": "never"}),
        "issued in the future": _signed({"alg": "HS256"}, {**claims, "iat": iat + 31}),
        "two parts": f"{header}.{payload}",
        "not base64": f"{header}.{payload}.+/=",
        "payload not an object": _signed({"alg": "HS256"}, ["alice"]),
        "empty": "",
    }
    for name, token in cases.items():
        with pytest.raises(CredentialInvalid):
            jwt.verify_token(token, KEY, NOW)
            pytest.fail(name)
    with pytest.raises(CredentialInvalid, match="no JWT key"):
        jwt.verify_token(good, b"", NOW)


def test_an_expired_token_is_refused_as_expired() -> None:
    token = jwt.make_token(KEY, "alice", NOW - timedelta(hours=2), 3600)
    with pytest.raises(CredentialExpired):
        jwt.verify_token(token, KEY, NOW)
    # exp is exclusive: at that second it is over
    token = jwt.make_token(KEY, "alice", NOW - timedelta(seconds=60), 60)
    with pytest.raises(CredentialExpired):
        jwt.verify_token(token, KEY, NOW)


def test_the_key_file_must_not_be_open_to_others(tmp_path: Path) -> None:
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    assert jwt.load_key(key) == KEY
    key.chmod(0o640)
    assert jwt.load_key(key) == KEY  # a group the daemon's user is in may read it
    for mode in (0o604, 0o620, 0o666):
        key.chmod(mode)
        with pytest.raises(ConfigError, match="others"):
            jwt.load_key(key)
    key.chmod(0o600)
    key.write_bytes(b"")
    with pytest.raises(ConfigError, match="empty"):
        jwt.load_key(key)
    with pytest.raises(ConfigError, match="cannot read"):
        jwt.load_key(tmp_path / "missing")


# ------------------------------------------------------------------ trusted proxy


def test_peer_in_trusted_networks() -> None:
    networks = proxy.parse_networks(["10.0.0.5", "192.168.10.0/24", "fd00::/64"])
    assert proxy.peer_in("10.0.0.5", networks)
    assert proxy.peer_in("192.168.10.77", networks)
    assert proxy.peer_in("::ffff:192.168.10.77", networks)  # a dual-stack socket's view
    assert proxy.peer_in("fd00::1", networks)
    assert not proxy.peer_in("10.0.0.6", networks)
    assert not proxy.peer_in("not-an-address", networks)
    assert not proxy.peer_in("127.0.0.1", ())
    with pytest.raises(ConfigError, match=r"'10\.0\.0\.0/8x'"):
        proxy.parse_networks(["10.0.0.0/8x"])
    with pytest.raises(ConfigError):
        proxy.parse_networks(["10.0.0.1/24"])  # host bits set: a typo, not a network


# ------------------------------------------------------------------ authenticate (no munged)


def _request(headers: dict[str, str] | list[tuple[str, str]], peer: str = "127.0.0.1") -> RequestView:
    items = tuple(headers.items()) if isinstance(headers, dict) else tuple(headers)
    return RequestView("GET", "/v1/usage", items, peer)


ME = pwd.getpwuid(os.getuid()).pw_name


def _settings(**overrides: object) -> AuthSettings:
    base: dict[str, object] = {
        "methods": ("jwt", "proxy"),
        "jwt_key": KEY,
        "trusted_proxies": proxy.parse_networks(["10.1.0.0/16"]),
        "access": AccessConfig(admins=["root"], finance=["fin"]),
        "coordinators": lambda user: frozenset({"physics"}) if user == "carol" else frozenset(),
    }
    base.update(overrides)
    return AuthSettings(**base)  # type: ignore[arg-type]


def test_jwt_identities_and_roles() -> None:
    settings = _settings()
    for header in ("X-SLURM-USER-TOKEN", "x-slurm-user-token"):
        token = jwt.make_token(KEY, "carol", NOW, 600)
        assert authenticate(_request({header: token}), settings, NOW) == Identity(
            "carol", Role.USER, frozenset({"physics"})
        )
    bearer = {"Authorization": "Bearer " + jwt.make_token(KEY, "fin", NOW, 600)}
    assert authenticate(_request(bearer), settings, NOW) == Identity("fin", Role.FINANCE)
    root = {"X-SLURM-USER-TOKEN": jwt.make_token(KEY, "root", NOW, 600)}
    assert authenticate(_request(root), settings, NOW) == Identity("root", Role.ADMIN)
    # a token is good until it expires, like Slurm's (no replay cache for JWTs)
    assert authenticate(_request(root), settings, NOW) == Identity("root", Role.ADMIN)


def test_jwt_denials() -> None:
    settings = _settings()
    token = jwt.make_token(KEY, "carol", NOW, 600)
    expired = jwt.make_token(KEY, "carol", NOW - timedelta(hours=1), 600)
    forged = jwt.make_token(b"not the key", "root", NOW, 600)
    cases = [
        ({"X-SLURM-USER-TOKEN": expired}, HTTPStatus.UNAUTHORIZED, "expired"),
        ({"X-SLURM-USER-TOKEN": forged}, HTTPStatus.UNAUTHORIZED, "signature"),
        (
            {"X-SLURM-USER-TOKEN": token, "X-SLURM-USER-NAME": "root"},
            HTTPStatus.FORBIDDEN,
            "not the token's user",
        ),
        ([("X-SLURM-USER-TOKEN", token), ("X-SLURM-USER-TOKEN", token)], HTTPStatus.UNAUTHORIZED, "2 times"),
    ]
    for headers, status, reason in cases:
        result = authenticate(_request(headers), settings, NOW)
        assert isinstance(result, Denied) and result.status == status and reason in result.reason, result
    # the matching user name header is fine (slurmrestd's clients send both)
    both = {"X-SLURM-USER-TOKEN": token, "X-SLURM-USER-NAME": "carol"}
    assert authenticate(_request(both), settings, NOW) == Identity("carol", Role.USER, frozenset({"physics"}))


def test_a_bad_credential_never_falls_through_to_the_next_method() -> None:
    # a forged token and a trusted proxy's header: the token decides, and it is refused
    forged = jwt.make_token(b"not the key", "root", NOW, 600)
    request = _request({"X-SLURM-USER-TOKEN": forged, "X-Remote-User": "carol"}, peer="10.1.2.3")
    result = authenticate(request, _settings(), NOW)
    assert isinstance(result, Denied) and result.method == "jwt"


def test_the_proxy_header_counts_only_from_a_trusted_proxy() -> None:
    settings = _settings()
    trusted = authenticate(_request({"X-Remote-User": "carol"}, peer="10.1.2.3"), settings, NOW)
    assert trusted == Identity("carol", Role.USER, frozenset({"physics"}))
    mapped = authenticate(_request({"x-remote-user": "carol"}, peer="::ffff:10.1.2.3"), settings, NOW)
    assert mapped == trusted
    for peer in ("10.2.0.1", "127.0.0.1", ""):
        result = authenticate(_request({"X-Remote-User": "root"}, peer=peer), settings, NOW)
        assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED, peer
    odd = authenticate(_request({"X-Remote-User": "root\r\nX: y"}, peer="10.1.2.3"), settings, NOW)
    assert isinstance(odd, Denied)
    custom = _settings(proxy_user_header="X-Forwarded-User")
    assert authenticate(_request({"X-Forwarded-User": "fin"}, peer="10.1.0.1"), custom, NOW) == Identity(
        "fin", Role.FINANCE
    )


def test_deny_by_default() -> None:
    # nothing presented; or only a method that is not enabled
    for settings, headers in [
        (_settings(), {}),
        (_settings(methods=("jwt",)), {"X-Remote-User": "root"}),
        (_settings(methods=("proxy",)), {"X-SLURM-USER-TOKEN": jwt.make_token(KEY, "root", NOW, 60)}),
        (_settings(methods=("munge",)), {"X-SLURM-USER-TOKEN": jwt.make_token(KEY, "root", NOW, 60)}),
        (_settings(methods=()), {"X-Remote-User": "root"}),
    ]:
        result = authenticate(_request(headers, peer="10.1.0.1"), settings, NOW)
        assert isinstance(result, Denied) and result.status == HTTPStatus.UNAUTHORIZED, (
            settings.methods,
            headers,
        )
        assert result.reason.startswith("no credential")
    with pytest.raises(ValueError, match="aware"):
        authenticate(_request({}), _settings(), NOW.replace(tzinfo=None))


def test_identity_for_resolves_roles_like_the_cli() -> None:
    access = AccessConfig(admins=["slurm"], finance=["fin"])
    none = lambda user: frozenset()  # noqa: E731
    assert identity_for("root", 0, access, none).role is Role.ADMIN  # uid 0, whatever its name
    assert identity_for("slurm", 64030, access, none).role is Role.ADMIN
    assert identity_for("fin", 2000, access, none) == Identity("fin", Role.FINANCE)
    assert identity_for("dave", None, access, lambda u: frozenset({"chem"})) == Identity(
        "dave", Role.USER, frozenset({"chem"})
    )


def test_settings_from_config(tmp_path: Path) -> None:
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    config = config_from_dict(
        {
            "api": {
                "auth_methods": ["jwt", "munge", "proxy"],
                "jwt_key_file": str(key),
                "trusted_proxies": ["10.1.0.0/16"],
                "munge_socket": "/run/munge/other.socket",
                "credential_ttl_seconds": 30,
                "replay_cache_entries": 10,
            },
            "access": {"finance": ["fin"]},
        }
    )
    settings = AuthSettings.from_config(config)
    assert settings.methods == ("jwt", "munge", "proxy")
    assert settings.jwt_key == KEY
    assert settings.munge_socket == "/run/munge/other.socket" and settings.credential_ttl_seconds == 30
    assert settings.replay_cache.max_entries == 10
    assert settings.access.finance == ["fin"]
    assert authenticate(_request({"X-Remote-User": "fin"}, peer="10.1.9.9"), settings, NOW) == Identity(
        "fin", Role.FINANCE
    )


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ({"auth_methods": []}, "at least one"),
        ({"auth_methods": ["kerberos"]}, "unknown method 'kerberos'"),
        ({"auth_methods": ["munge", "munge"]}, "twice"),
        ({"auth_methods": ["jwt"]}, "jwt_key_file is required"),
        ({"auth_methods": ["proxy"]}, "trusted_proxies is required"),
        ({"trusted_proxies": ["10.0.0.0/33"]}, "'10.0.0.0/33'"),
        ({"tls_cert_file": "/etc/cert.pem"}, "set both or neither"),
        ({"credential_ttl_seconds": 0}, "between 1 and 3600"),
        ({"port": 70000}, "api.port"),
        ({"proxy_user_header": "X Remote"}, "not a header name"),
        ({"tokn": "x"}, "unknown key 'api.tokn'"),
    ],
)
def test_api_config_errors_name_the_key(api: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"api": api})


def test_api_config_defaults() -> None:
    api = config_from_dict({}).api
    assert (api.listen_address, api.port, api.auth_methods, api.trusted_proxies) == (
        "127.0.0.1",
        9769,
        ["munge"],
        [],
    )
    assert api.proxy_user_header == "X-Remote-User" and api.credential_ttl_seconds == 60


# ------------------------------------------------------------------ the job-ended hook's policy


def test_peer_rate_limit_is_a_token_bucket_per_peer() -> None:
    limit = PeerRateLimit(rate_per_second=2.0, burst=4.0, max_peers=2)
    assert [limit.allow("10.0.0.1", 0.0) for _ in range(6)] == [True] * 4 + [False] * 2
    # another peer has its own bucket: a flood from one starves no other
    assert limit.allow("10.0.0.2", 0.0)
    # refills at the rate
    assert limit.allow("10.0.0.1", 0.5) and not limit.allow("10.0.0.1", 0.5)
    assert [limit.allow("10.0.0.1", 10.0) for _ in range(5)] == [True] * 4 + [False]
    # bounded: a third peer pushes out the least recently seen
    assert limit.allow("10.0.0.3", 10.0)
    with pytest.raises(ValueError):
        PeerRateLimit(0, 1)


def test_check_hook_request_takes_the_token_and_the_peers() -> None:
    policy = HookPolicy(token="job-ended-token-0123456789", peers=proxy.parse_networks(["10.0.0.0/24"]))
    cache = ReplayCache()

    def view(headers: list[tuple[str, str]], peer: str = "10.0.0.5") -> RequestView:
        return RequestView("POST", "/v1/job-ended", tuple(headers), peer)

    assert (
        check_hook_request(view([("Authorization", "Bearer job-ended-token-0123456789")]), policy, cache, NOW)
        == "token"
    )
    for headers, peer, status in [
        ([("Authorization", "Bearer job-ended-token-0123456789")], "10.0.1.5", HTTPStatus.FORBIDDEN),
        ([("Authorization", "Bearer job-ended-token-012345678")], "10.0.0.5", HTTPStatus.UNAUTHORIZED),
        ([], "10.0.0.5", HTTPStatus.UNAUTHORIZED),
        ([("Authorization", "Basic cm9vdDo=")], "10.0.0.5", HTTPStatus.UNAUTHORIZED),
        ([("Authorization", "Bearer job-ended-token-0123456789")] * 2, "10.0.0.5", HTTPStatus.UNAUTHORIZED),
    ]:
        result = check_hook_request(view(headers, peer), policy, cache, NOW)
        assert isinstance(result, Denied) and result.status == status, (headers, peer)
    # no token configured: a bearer token is never enough
    result = check_hook_request(view([("Authorization", "Bearer ")]), HookPolicy(), cache, NOW)
    assert isinstance(result, Denied) and "no token is configured" in result.reason


def test_hook_policy_from_config(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("job-ended-token-0123456789\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="every user"):
        HookPolicy.from_config(config_from_dict({"daemon": {"job_end_token_file": str(token)}}))
    token.chmod(0o620)
    with pytest.raises(ConfigError, match="its group write"):
        HookPolicy.from_config(config_from_dict({"daemon": {"job_end_token_file": str(token)}}))
    token.chmod(0o600)
    token.write_text("job-ended-token\x000123456789\n")
    with pytest.raises(ConfigError, match="NUL"):
        HookPolicy.from_config(config_from_dict({"daemon": {"job_end_token_file": str(token)}}))
    token.write_text("job-ended-token-0123456789\n")
    config = config_from_dict(
        {
            "daemon": {"job_end_users": ["root", "no-such-user-here"], "job_end_token_file": str(token)},
            "api": {"munge_socket": "/run/munge/x.socket", "credential_ttl_seconds": 30},
        }
    )
    policy = HookPolicy.from_config(config)
    assert policy.uids == frozenset({0}) and policy.token == "job-ended-token-0123456789"
    assert (policy.munge_socket, policy.max_age_seconds) == ("/run/munge/x.socket", 30)
    assert "job-ended-token" not in repr(policy)
    token.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16"):
        HookPolicy.from_config(config)
    with pytest.raises(ConfigError, match=r"daemon\.job_end_peers"):
        config_from_dict({"daemon": {"job_end_peers": ["slurmctld-host"]}})
    with pytest.raises(ConfigError, match="job_end_rate_per_second"):
        config_from_dict({"daemon": {"job_end_rate_per_second": 0}})


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:9769", True),
        ("http://localhost:9769", True),
        ("http://[::1]:9769", True),
        ("https://head01:9769", True),
        ("http://head01:9769", False),
        ("http://10.1.2.3:9769", False),
    ],
)
def test_the_client_refuses_plain_http_to_another_host(url: str, allowed: bool) -> None:
    from slurmtel.api.client import ApiClient

    config = config_from_dict({"api": {"url": url}})
    if allowed:
        ApiClient(config)
    else:
        with pytest.raises(ConfigError, match="unencrypted"):
            ApiClient(config)
        ApiClient(config_from_dict({"api": {"url": url, "allow_plain_http": True}}))
