"""Account coordinators see their accounts (DESIGN §8): sacctmgr says who they are."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from slurmtel.access import Action, Identity, Role, allowed
from slurmtel.commands.common import coordinated_accounts
from slurmtel.config import config_from_dict
from slurmtel.errors import ParseError
from slurmtel.parsers.sacctmgr import parse_account_parents, parse_coordinators, with_sub_accounts
from tests.conftest import fixture_path

CAPTURE = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-user-withcoord.psv")
FLAT_TREE = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-account-withassoc.psv")
NESTED_TREE = fixture_path("slurmctld", "slurm-22.05", "sacctmgr-show-account-withassoc-nested.psv")


def test_coordinators_from_the_real_capture() -> None:
    assert parse_coordinators(CAPTURE.read_text()) == {
        "alice": frozenset({"chemistry", "physics"}),
        "carol": frozenset({"biology"}),
    }


def fake_sacctmgr(tmp_path: Path, body: str) -> str:
    path = tmp_path / "sacctmgr"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_coordinator_sees_own_jobs_and_the_accounts(tmp_path: Path) -> None:
    command = fake_sacctmgr(
        tmp_path,
        f'[ "$*" = "-P show account withassoc" ] && exec cat {FLAT_TREE}\n'
        f'[ "$*" = "-n -P show user withcoord format=User,Coordinators" ] || exit 9\ncat {CAPTURE}\n',
    )
    config = config_from_dict({"access": {"sacctmgr_command": command}})
    accounts = coordinated_accounts(config, "alice")
    assert accounts == {"chemistry", "physics"}
    scope = allowed(Identity("alice", Role.USER, accounts), Action.VIEW_JOBS)
    assert (scope.users, scope.accounts) == ({"alice"}, {"chemistry", "physics"})
    assert coordinated_accounts(config, "bob") == frozenset()


@pytest.mark.parametrize("body", ["echo 'sacctmgr: error: slurmdbd down' >&2; exit 1\n", "sleep 60\n"])
def test_when_sacctmgr_cannot_say_nobody_is_a_coordinator(
    tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slurmtel.commands.common.run_command", _short_timeout)
    config = config_from_dict({"access": {"sacctmgr_command": fake_sacctmgr(tmp_path, body)}})
    assert coordinated_accounts(config, "alice") == frozenset()
    assert (
        coordinated_accounts(config_from_dict({"access": {"sacctmgr_command": ""}}), "alice") == frozenset()
    )


def _short_timeout(argv: list[str], *, timeout_seconds: float) -> bytes:
    from slurmtel.sources.io import run_command

    return run_command(argv, timeout_seconds=min(timeout_seconds, 1))


def test_the_account_tree_from_real_captures() -> None:
    flat = parse_account_parents(FLAT_TREE.read_text())
    assert flat == {a: {"root"} for a in ("biology", "chemistry", "physics")}
    nested = parse_account_parents(NESTED_TREE.read_text())
    assert nested["organic"] == {"chemistry"} and nested["polymers"] == {"organic"}
    assert with_sub_accounts({"chemistry"}, nested) == {"chemistry", "organic", "polymers"}
    assert with_sub_accounts({"organic", "physics"}, nested) == {"organic", "polymers", "physics"}
    assert with_sub_accounts({"chemistry"}, flat) == {"chemistry"}
    with pytest.raises(ParseError, match="ParentName"):
        parse_account_parents("Account|Descr\nchemistry|x\n")


def test_a_coordinator_reaches_the_sub_accounts_as_in_slurm(tmp_path: Path) -> None:
    command = fake_sacctmgr(
        tmp_path,
        f'[ "$*" = "-P show account withassoc" ] && exec cat {NESTED_TREE}\nexec cat {CAPTURE}\n',
    )
    config = config_from_dict({"access": {"sacctmgr_command": command}})
    assert coordinated_accounts(config, "alice") == {"chemistry", "organic", "polymers", "physics"}
    assert coordinated_accounts(config, "carol") == {"biology"}
    assert coordinated_accounts(config, "dave") == frozenset()


def test_without_the_tree_a_coordinator_keeps_the_named_accounts_only(tmp_path: Path) -> None:
    command = fake_sacctmgr(
        tmp_path, f'[ "$*" = "-P show account withassoc" ] && exit 1\nexec cat {CAPTURE}\n'
    )
    config = config_from_dict({"access": {"sacctmgr_command": command}})
    assert coordinated_accounts(config, "alice") == {"chemistry", "physics"}
