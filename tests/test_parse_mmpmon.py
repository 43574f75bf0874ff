"""`mmpmon -p` fs_io_s on the real answer published with treydock/gpfs_exporter (OSC's Pitzer)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtel.parsers.mmpmon import parse_mmpmon_fs_io_s
from slurmtel.records import GpfsFsIo, Rejected
from tests.conftest import fixture_path

CAPTURE = fixture_path("mmpmon", "gpfs_exporter_mmpmon_fs_io_s.txt")


def test_each_file_system_of_the_node() -> None:
    scratch, project = parse_mmpmon_fs_io_s(CAPTURE.read_text())
    assert isinstance(scratch, GpfsFsIo) and isinstance(project, GpfsFsIo)
    assert (scratch.node_name, scratch.node_address, scratch.cluster, scratch.filesystem, scratch.disks) == (
        "ib-pitzer-rw02.ten", "10.22.0.106", "gpfs.domain", "scratch", 48,
    )  # fmt: skip
    assert scratch.at == datetime.fromtimestamp(1579358234.053212, UTC)
    assert (scratch.read_bytes, scratch.write_bytes) == (205607400434, 74839282351)
    assert (scratch.opens, scratch.closes, scratch.reads, scratch.writes) == (
        2377656,
        2201576,
        59420404,
        18874626,
    )
    assert (scratch.readdirs, scratch.inode_updates) == (40971, 544768)
    assert (project.filesystem, project.read_bytes, project.opens) == ("project", 0, 513)


def test_a_failed_answer_or_a_broken_line_is_quarantined_the_rest_kept() -> None:
    lines = CAPTURE.read_text().splitlines()
    failed = lines[1].replace("_rc_ 0", "_rc_ 19")
    broken = lines[2].replace("_bw_ 0", "_bw_ lots")
    out = parse_mmpmon_fs_io_s(
        "\n".join([failed, broken, lines[1], "_io_s_ _n_ 10.22.0.106"]), origin="gpu01"
    )
    bad = [r for r in out if isinstance(r, Rejected)]
    good = [r for r in out if isinstance(r, GpfsFsIo)]
    assert [r.reason for r in bad] == ["mmpmon return code '19'", "_bw_ 'lots' is not a counter"]
    assert bad[0].origin == "gpu01" and bad[0].record_key == "line 1"
    assert [g.filesystem for g in good] == ["scratch"]


@settings(
    max_examples=100, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_fuzz_never_raises(raw: str | bytes) -> None:
    for record in parse_mmpmon_fs_io_s(raw):
        assert isinstance(record, GpfsFsIo | Rejected)
    for record in parse_mmpmon_fs_io_s(b"_fs_io_s_ " + (raw.encode() if isinstance(raw, str) else raw)):
        assert isinstance(record, GpfsFsIo | Rejected)
