"""The embedded PostgreSQL refuses, with one clear line, a data directory of another user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmtel.errors import DatabaseUnavailable
from slurmtel.store.embedded import _check_owner


def test_another_users_data_directory_is_refused_by_name(tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    if os.getuid() == 0:
        os.chown(pgdata, 65534, 65534)
        owner = 65534
        caller = 1000
    else:
        owner = os.getuid()
        caller = owner + 1
    with pytest.raises(DatabaseUnavailable, match=r"belongs to .*site\.state_dir.*database\.url"):
        _check_owner(pgdata, uid=caller)
    _check_owner(pgdata, uid=owner)  # its owner may
    _check_owner(pgdata, uid=0)  # and root (pgserver runs root's server as its own user)
    _check_owner(tmp_path / "absent", uid=caller)  # nothing there yet: it will be created
