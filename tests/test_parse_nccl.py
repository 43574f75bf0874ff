"""nccl-tests / rccl-tests logs -> NcclRun records.

Each folder under tests/fixtures/nccl_tests/cases holds a real log (input.txt) and the records
the parser must return (expected.json, the golden output). SLURMTEL_UPDATE_GOLDEN=1 rewrites
the golden files from the parser (then read the diff before committing it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from slurmtel.parsers.nccl import normalize_pci_bus_id, parse_nccl_tests
from slurmtel.records import NcclRun, Rejected

CASES = Path(__file__).parent / "fixtures" / "nccl_tests" / "cases"
CASE_NAMES = sorted(p.name for p in CASES.iterdir() if (p / "input.txt").is_file())


def as_json(records: list[NcclRun | Rejected]) -> list[dict[str, Any]]:
    out = []
    for record in records:
        if isinstance(record, Rejected):
            out.append({"rejected": record.reason, "record_key": record.record_key})
        else:
            out.append(json.loads(json.dumps(dataclasses.asdict(record))))
    return out


def read_case(name: str) -> bytes:
    return (CASES / name / "input.txt").read_bytes()


def runs_of(raw: bytes | str) -> list[NcclRun]:
    records = parse_nccl_tests(raw, origin="test")
    assert all(isinstance(r, NcclRun) for r in records), records
    return [r for r in records if isinstance(r, NcclRun)]


def test_every_capture_has_a_case() -> None:
    # every capture the provenance lists (copied from the shared store) is a case folder, and
    # every case folder is a listed capture
    provenance = (CASES.parent / "PROVENANCE.md").read_text()
    listed = set(re.findall(r"^\| `([^`/]+)\.txt` \|", provenance, re.M))
    assert len(listed) >= 20
    assert listed == set(CASE_NAMES)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case(name: str) -> None:
    got = as_json(parse_nccl_tests(read_case(name), origin=f"{name}/input.txt"))
    expected_file = CASES / name / "expected.json"
    if os.environ.get("SLURMTEL_UPDATE_GOLDEN") == "1":
        expected_file.write_text(json.dumps(got, indent=1) + "\n")
    expected = json.loads(expected_file.read_text())
    assert got == expected


# ---------------------------------------------------------------- what the golden files hold, named


def only_run(name: str) -> NcclRun:
    (run,) = runs_of(read_case(name))
    return run


def test_two_node_allreduce_ok() -> None:
    run = only_run("gcp_a3mega_h100_2x8_mpirun_allreduce")
    assert (run.status, run.collective, run.ranks) == ("ok", "all_reduce", 16)
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert run.gpu_model == "NVIDIA H100 80GB HBM3"
    assert run.avg_busbw_gbps == 70.742 and run.avg_busbw_source == "footer"
    assert run.peak_busbw_gbps == 338.82
    assert len(run.results) == 31 and run.results[-1].size_bytes == 8589934592
    assert run.rank_devices[2].pci_id == "0000:0b:00"
    assert run.rank_devices[2].pci_bus_id == "00000000:0B:00.0"


def test_versions_from_every_form() -> None:
    assert only_run("nris_olivia_gh200_4node_slingshot_corrupted_wrong_nonzero").nccl_version == "2.29.2"
    two = only_run("cscs_alps_gh200_2node_1gpu_srun_v2.18.2_sarus")
    assert (two.tests_version, two.nccl_version) == ("2.18.2", "2.30.7")
    assert only_run("cybertronai_p3dn_v100_2node_nccl2.4.6_efa_debuginfo").nccl_version == "2.4.6"
    assert only_run("moc_h100_2node_roce_allreduce_nccl2.26.2_debuginfo").nccl_version == "2.26.2"
    assert only_run("gh_nccl-tests-5_p100_nccl1.0_unhandled_cuda_error").nccl_version == "1.0"
    rccl = only_run("rccl_tests_mi300x_2node_slurm_rccl2.22.3")
    assert (rccl.tool, rccl.library, rccl.nccl_version, rccl.tests_version) == (
        "rccl-tests",
        "rccl",
        "2.22.3",
        "develop:448c4c7",
    )


def test_rank_lines_without_group_or_pid_or_model() -> None:
    old = only_run("cybertronai_p3dn_v100_2node_nccl2.4.6_efa_debuginfo")
    assert old.rank_devices[0].group is None and old.rank_devices[0].pid == 62652
    assert old.rank_devices[0].pci_id == "0x00" and old.rank_devices[0].pci_bus_id == ""
    oldest = only_run("gh_nccl-tests-5_p100_nccl1.0_unhandled_cuda_error")
    assert oldest.rank_devices[0].pid is None and oldest.hosts == ("node03",)
    function = only_run("rccl_tests_mi300x_2node_slurm_rccl2.22.3")
    assert function.rank_devices[0].pci_bus_id == "00000000:05:00.0"
    bare = only_run("rccl_tests_mi355x_2node_pollara_noheader_nofooter")
    assert bare.gpu_model == "" and bare.ranks == 16


def test_error_column_and_out_of_bounds_failed() -> None:
    run = only_run("gh_nccl-tests-37_v100_allgather_4G_out_of_bounds_FAILED_nohash")
    assert run.status == "failed"
    assert run.out_of_bounds_values == 2
    assert run.results[0].out_of_place_error == 1.0 and run.results[0].out_of_place_wrong is None
    assert run.collective == "all_gather"
    older = only_run("cybertronai_p3dn_v100_2node_nccl2.4.6_efa_debuginfo")
    assert older.results[0].out_of_place_error == 2e-07 and older.status == "ok"


def test_wrong_values_without_footer_fail() -> None:
    run = only_run("nris_olivia_gh200_4node_slingshot_corrupted_wrong_nonzero")
    assert run.status == "failed"
    assert (
        run.wrong_values
        == 18134 + 9609 + 96817 + 124342 + 763876 + 530181 + 404221 + 103664 + 951005 + 820604 + 113492
    )
    assert not run.footer_seen and run.avg_busbw_source == "computed"
    assert any("no footer" in r for r in run.reasons)


def test_in_place_not_available() -> None:
    run = only_run("gh_nccl-tests-287_rtx5090_1gpu_alltoall_inplace_NA")
    assert run.results[0].in_place_wrong is None and run.results[0].out_of_place_wrong == 0
    assert run.status == "ok" and run.collective == "alltoall"
    sendrecv = only_run("moc_h100_2node_roce_sendrecv_4gpu_perproc_nccl2.26.2_debuginfo")
    assert all(r.in_place_wrong is None for r in sendrecv.results)


def test_prefixes_and_info_lines_inside_the_table() -> None:
    run = only_run("aws_eks_efa_g4dn_t4_2pod_mpijob_debuginfo_rankprefix")
    assert run.status == "ok" and len(run.results) == 31
    assert run.results[0].size_bytes == 0 and run.nccl_version == "2.12.7"
    superbench = only_run("superbench_a100_8gpu_broadcast_validation0")
    assert len(superbench.results) == 34 and superbench.validation is False


def test_failed_rank_and_truncated_banner() -> None:
    run = only_run("gh_nccl-tests-219_a6000_2node_internal_error_TRUNCATED")
    assert run.status == "failed" and run.failed_hosts == ("fengyun",)
    assert run.hosts == ("fengyun416", "fengyun") and run.results == ()


def test_missing_header_and_footer_is_degraded() -> None:
    run = only_run("rccl_tests_mi355x_2node_pollara_noheader_nofooter")
    assert run.status == "degraded"
    assert run.collective == "all_reduce" and run.collective_source == "table"


def test_collective_inferred_from_the_table_only_when_certain() -> None:
    assert only_run("superbench_a100_8gpu_allgather_validation0").collective == "all_gather"
    assert only_run("superbench_a100_8gpu_alltoall_validation0").collective == "alltoall"
    assert only_run("superbench_a100_8gpu_broadcast_validation0").collective == "broadcast"
    # two ranks: all_reduce and sendrecv look alike
    assert only_run("moc_h100_2node_roce_allreduce_nccl2.26.2_debuginfo").collective == ""


# ---------------------------------------------------------------- variants built from the real logs


def test_crlf_ansi_and_srun_labels_read_the_same() -> None:
    raw = read_case("cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook").decode()
    (plain,) = runs_of(raw)
    crlf = raw.replace("\n", "\r\n")
    ansi = "\n".join(f"\x1b[32m{line}\x1b[0m" if line.startswith("#") else line for line in raw.split("\n"))
    labelled = "\n".join(f"{i % 8}: {line}" if line else line for i, line in enumerate(raw.split("\n")))
    for variant in (crlf, ansi, labelled):
        (run,) = runs_of(variant)
        assert run == plain


def test_several_runs_in_one_log() -> None:
    first = read_case("cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook").decode()
    second = read_case("cscs_alps_gh200_2node_srun_v2.17.1_no_cxi_hook_slow").decode()
    third = read_case("superbench_a100_8gpu_allgather_validation0").decode()
    runs = runs_of(first + second + "+ ./build/all_gather_perf -b 1 -e 8G -f 2 -g 8\n" + third)
    assert [r.index for r in runs] == [0, 1, 2]
    assert [r.avg_busbw_gbps for r in runs] == [19.7866, 1.58767, 58.2651]
    assert runs[2].collective == "all_gather" and runs[2].collective_source == "log"
    assert runs[1].hosts == ("nid005471", "nid005487")


def test_cut_off_table_is_degraded() -> None:
    raw = read_case("gcp_a3mega_h100_2x8_mpirun_allreduce").decode()
    lines = raw.splitlines()
    cut = "\n".join(lines[:40]) + "\n" + lines[40][:50]
    (run,) = runs_of(cut)
    assert run.status == "degraded"
    assert len(run.results) == 40 - 23
    assert any("unreadable table row" in r for r in run.reasons)
    assert any(f"after {len(run.results)} of 31 sizes" in r for r in run.reasons)


def test_interleaved_output_in_a_row_is_not_a_measurement() -> None:
    raw = read_case("cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook").decode()
    broken = raw.replace(
        "        4096          1024     float     sum      -1    31.97",
        "        4096          1024     float     sum      -1  nid005471:204199:204199 [0] NCCL INFO x",
    )
    (run,) = runs_of(broken)
    assert run.status == "degraded" and len(run.results) == 24


def test_srun_and_mpi_failures_name_the_host() -> None:
    raw = read_case("cscs_alps_gh200_2node_srun_v2.17.1_cxi_hook").decode()
    failing = raw + "srun: error: nid005487: task 5: Exited with exit code 1\n"
    (run,) = runs_of(failing)
    assert run.status == "failed" and run.failed_hosts == ("nid005487",)
    ok_exit = raw + "srun: error: nid005487: task 5: Exited with exit code 0\n"
    assert runs_of(ok_exit)[0].status == "ok"
    signal = raw + (
        "mpirun noticed that process rank 3 with PID 0 on node nid005471 exited on signal 9 (Killed).\n"
    )
    assert runs_of(signal)[0].failed_hosts == ("nid005471",)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "hello world\n",
        "\x00\x01\x02 binary \xff",
        "srun: error: gpu01: task 0: Exited with exit code 1\n",
    ],
)
def test_text_without_nccl_output_is_rejected(raw: str) -> None:
    (record,) = parse_nccl_tests(raw, origin="job.out")
    assert isinstance(record, Rejected)
    assert record.source == "nccl" and "no nccl-tests" in record.reason


def test_invalid_utf8_is_read() -> None:
    raw = read_case("superbench_a100_8gpu_alltoall_validation0") + b"\xff\xfe garbage\n"
    assert runs_of(raw)[0].status == "ok"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:04:00", "00000000:04:00.0"),
        ("0000:05:00.0", "00000000:05:00.0"),
        ("0009:01:00", "00000009:01:00.0"),
        ("00000000:C2:00.0", "00000000:C2:00.0"),
        ("0x35", ""),
        ("", ""),
    ],
)
def test_pci_bus_id_forms(text: str, expected: str) -> None:
    assert normalize_pci_bus_id(text) == expected
