"""/proc/self/mountstats on prometheus/procfs' capture: one NFSv4 mount among local ones."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtel.parsers.mountstats import parse_mountstats
from slurmtel.records import NfsMountStats, Rejected
from tests.conftest import fixture_path

CAPTURE = fixture_path("mountstats", "procfs_proc_26231_mountstats")


def test_nfs_mount_counters() -> None:
    (mount,) = parse_mountstats(CAPTURE.read_text())
    assert isinstance(mount, NfsMountStats)
    assert (mount.device, mount.mountpoint, mount.fstype) == (
        "192.168.1.1:/srv/test",
        "/mnt/nfs/test",
        "nfs4",
    )
    assert mount.age_seconds == 13968
    assert mount.read_bytes == 1207640230 and mount.write_bytes == 0
    assert mount.server_read_bytes == 1210214218
    assert mount.read_ops == 1298 and mount.read_rtt_seconds == pytest.approx(79.386)


def test_bad_line_quarantines_that_mount() -> None:
    text = CAPTURE.read_text().replace("bytes:\t1207640230 0 0 0", "bytes:\tx 0 0 0")
    (bad,) = parse_mountstats(text, origin="gpu01")
    assert isinstance(bad, Rejected) and "bytes" in bad.reason and bad.origin == "gpu01"
    assert "192.168.1.1:/srv/test" in bad.record_key


@settings(
    max_examples=100, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_fuzz_never_raises(raw: str | bytes) -> None:
    prefix = "device a:/b mounted on /c with fstype nfs\n"
    for record in parse_mountstats(
        prefix + (raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
    ):
        assert isinstance(record, NfsMountStats | Rejected)
