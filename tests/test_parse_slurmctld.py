"""Controller-view parsers (scontrol/squeue/sinfo/slurmrestd) on real captures.

Fixtures: tests/fixtures/slurmctld (see PROVENANCE.md). Expected values were read by hand from
the files: which job holds which GPU indices on which node, which jobs pend and why, node GPU
totals/use and states. Variants that a capture does not show (a broken record, an error
document) are built in the tests from the real files' content; the files are never edited.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from slurmtel.errors import ParseError
from slurmtel.parsers.gres import GresItem, parse_gres, parse_index_list
from slurmtel.parsers.slurmctld import (
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)
from slurmtel.records import GpuAllocation, NodeState, PendingJob, Rejected, SchemaNotice

FIXTURES = Path(__file__).parent / "fixtures" / "slurmctld"
AT = datetime(2026, 12, 2, 13, 5, 0, tzinfo=UTC)
LAB = "slurm-22.05"


def read(*parts: str) -> str:
    path = FIXTURES.joinpath(*parts)
    assert path.exists(), path
    return path.read_text()


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def allocations(records: list) -> set[tuple[int, str, int, str, datetime]]:
    return {
        (r.job_id_raw, r.node, r.gpu_index, r.gpu_model, r.submit_at)
        for r in records
        if isinstance(r, GpuAllocation)
    }


def pending(records: list) -> list[tuple[int, str, str, str, str, str, int, datetime, datetime | None]]:
    return sorted(
        (
            r.job_id_raw,
            r.job_id,
            r.user,
            r.account,
            r.partition,
            r.reason,
            r.gpus_requested,
            r.submit_at,
            r.eligible_at,
        )
        for r in records
        if isinstance(r, PendingJob)
    )


def rejected(records: list) -> list[Rejected]:
    return [r for r in records if isinstance(r, Rejected)]


def scontrol(tag: str, *, oneliner: bool = False) -> list:
    name = f"scontrol-show-job-d-{'oneliner-' if oneliner else ''}{tag}.txt"
    return parse_scontrol_jobs(read(LAB, name), cluster="lab", at=AT)


def squeue(*parts: str) -> list:
    return parse_squeue_json(read(*parts), cluster="lab", at=AT)


T0 = utc("2026-12-02T13:00:06")
T3 = utc("2026-12-02T13:01:55")


def held(job: int, node: str, indices: range | tuple[int, ...], submit: datetime, model: str = "h100") -> set:
    return {(job, node, index, model, submit) for index in indices}


# Read by hand from slurm-22.05/scontrol-show-job-d-*.txt (the per-node "Nodes=... GRES=" lines)
LAB_ALLOCATIONS = {
    "running-1": held(1, "gpu01", (0,), T0)
    | held(2, "gpu01", (1,), T0)
    | held(3, "gpu01", (2, 3), T0)
    | held(4, "gpu02", range(4), T0),
    "running-2": held(3, "gpu01", (2, 3), T0)
    | held(4, "gpu02", range(4), T0)
    | held(5, "gpu01", (0,), T0)
    | held(6, "gpu01", (1,), T0),
    "running-3": held(18, "gpu02", (0, 1), T3)
    | held(19, "gpu02", (2, 3), T3)
    | held(20, "gpu01", (0, 1, 2), T3),
    "nodedown": held(20, "gpu01", (0, 1, 2), T3),
    "final": set(),
    # folded detail line "Nodes=gpu[01-02] CPU_IDs=0 Mem=256 GRES=gpu:h100:2(IDX:0-1)"
    "multinode-running": held(2, "gpu01", (0, 1), utc("2026-12-02T13:15:51"))
    | held(2, "gpu02", (0, 1), utc("2026-12-02T13:15:51")),
    "single-running-gpu2": held(21, "gpu01", (0, 1), utc("2026-12-02T13:14:19")),
}


def waiting(
    job: int, job_id: str, user: str, account: str, reason: str, gpus: int, submit: datetime = T0, eligible=T0
):
    return (job, job_id, user, account, "gpu", reason, gpus, submit, eligible)


# Read by hand: JobState=PENDING records, Reason=, TRES=...gres/gpu=N, UserId=, Account=
LAB_PENDING = {
    "running-1": [
        waiting(5, "5", "carol", "biology", "Resources", 1),
        waiting(6, "6", "bob", "chemistry", "Priority", 1),
        waiting(7, "7", "bob", "chemistry", "Priority", 1),
        waiting(8, "8", "alice", "physics", "Priority", 4),
        waiting(9, "9", "bob", "chemistry", "Priority", 4),
        waiting(10, "10_[1-4%2]", "alice", "physics", "Priority", 1),
        waiting(11, "11", "alice", "chemistry", "Priority", 1),
        # -N2 --gpus-per-node=1: TresPerNode=gres:gpu:1, TRES gres/gpu=2
        waiting(13, "13", "carol", "biology", "Priority", 2),
    ],
    "running-2": [
        # requeued: submit reset to the requeue time, eligible 20 s later (cred_expire)
        waiting(
            2, "2", "carol", "biology", "BeginTime", 1, utc("2026-12-02T13:00:11"), utc("2026-12-02T13:00:32")
        ),
        waiting(7, "7", "bob", "chemistry", "Resources", 1),
        waiting(8, "8", "alice", "physics", "Priority", 4),
        waiting(10, "10_[1-4%2]", "alice", "physics", "Priority", 1),
        waiting(11, "11", "alice", "chemistry", "Priority", 1),
        waiting(13, "13", "carol", "biology", "Priority", 2),
    ],
    "running-3": [],
    "nodedown": [
        waiting(
            19,
            "19",
            "alice",
            "physics",
            "BeginTime",
            2,
            utc("2026-12-02T13:02:02"),
            utc("2026-12-02T13:02:23"),
        ),
    ],
    "final": [],
    "multinode-running": [],
    "single-running-gpu2": [],
}


# --------------------------------------------------------------------------- scontrol show job


@pytest.mark.parametrize("tag", sorted(LAB_ALLOCATIONS))
def test_scontrol_show_job_golden(tag: str) -> None:
    records = scontrol(tag)
    assert rejected(records) == []
    assert allocations(records) == LAB_ALLOCATIONS[tag]
    assert pending(records) == LAB_PENDING[tag]
    assert len(records) == len(LAB_ALLOCATIONS[tag]) + len(LAB_PENDING[tag])
    for record in records:
        assert record.cluster == "lab"
        assert record.observed_at == AT


@pytest.mark.parametrize("tag", ["running-1", "running-2", "running-3", "nodedown", "final"])
def test_scontrol_oneliner_reads_the_same(tag: str) -> None:
    # `scontrol show job -d -o` prints the same records one per line
    assert scontrol(tag, oneliner=True) == scontrol(tag)


def test_scontrol_submit_time_is_read_in_the_given_zone() -> None:
    # scontrol prints local time without a zone; in Europe/Berlin (UTC+1 in December)
    # 13:00:06 is 12:00:06 UTC
    records = parse_scontrol_jobs(
        read(LAB, "scontrol-show-job-d-running-1.txt"),
        cluster="lab",
        at=AT,
        timezone=ZoneInfo("Europe/Berlin"),
    )
    first = records[0]
    assert isinstance(first, GpuAllocation)
    assert (first.job_id_raw, first.submit_at) == (1, utc("2026-12-02T12:00:06"))
    job5 = next(r for r in records if isinstance(r, PendingJob) and r.job_id_raw == 5)
    assert job5.eligible_at == utc("2026-12-02T12:00:06")


def test_scontrol_show_job_without_detail_clockwork() -> None:
    # `scontrol show job` (no -d) from Slurm 20.11: two pending jobs; TresPerNode=gpu:titanxp:1
    # (old spelling), a Reason with commas, StartTime="None" quoted
    records = parse_scontrol_jobs(read("clockwork", "scontrol_job_2.txt"), cluster="mila", at=AT)
    assert pending(records) == [
        (
            1,
            "1",
            "nobody",
            "def-cerise-rrg",
            "long",
            "JobHeldAdmin",
            1,
            utc("2020-12-15T16:44:08"),
            utc("2020-12-15T16:44:08"),
        ),
        (
            2,
            "2",
            "nobody",
            "def-cerise-rrg",
            "long",
            "ReqNodeNotAvail,_UnavailableNodes:node8,nodek4,nodep[1-2],nodex3",
            1,
            utc("2021-08-12T10:22:30"),
            utc("2021-08-12T10:24:30"),
        ),
    ]
    assert len(records) == 2


def test_scontrol_bad_record_is_rejected_rest_kept() -> None:
    # the real running-1 text with job 3's SubmitTime and job 4's IDX list damaged
    text = read(LAB, "scontrol-show-job-d-running-1.txt")
    records_text = text.split("\n\n")
    assert records_text[2].startswith("JobId=3 ") and records_text[3].startswith("JobId=4 ")
    records_text[2] = records_text[2].replace(
        "SubmitTime=2026-12-02T13:00:06", "SubmitTime=2026-13-02T13:00:06"
    )
    records_text[3] = records_text[3].replace("(IDX:0-3)", "(IDX:0-x)")
    records = parse_scontrol_jobs("\n\n".join(records_text), cluster="lab", at=AT)
    bad = rejected(records)
    assert [(r.record_key, r.source, r.origin) for r in bad] == [
        ("job 3", "slurmctld", "scontrol show job -d"),
        ("job 4", "slurmctld", "scontrol show job -d"),
    ]
    assert "month must be in 1..12" in bad[0].reason
    assert "bad index list '0-x'" in bad[1].reason
    assert bad[0].raw.startswith("JobId=3 JobName=gpu2-srun-ok\nUserId=alice(1002)")
    assert allocations(records) == held(1, "gpu01", (0,), T0) | held(2, "gpu01", (1,), T0)
    assert pending(records) == LAB_PENDING["running-1"]


def test_scontrol_empty_and_error_output() -> None:
    assert parse_scontrol_jobs("", cluster="lab", at=AT) == []
    assert parse_scontrol_jobs("No jobs in the system\n", cluster="lab", at=AT) == []
    with pytest.raises(ParseError, match="no JobId= record"):
        parse_scontrol_jobs(
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
            cluster="lab",
            at=AT,
        )
    with pytest.raises(ParseError, match="no NodeName= record"):
        parse_scontrol_nodes(
            "slurm_load_node error: Invalid user for SlurmUser slurm\n", cluster="lab", at=AT
        )


# --------------------------------------------------------------------------- squeue --json


@pytest.mark.parametrize("tag", sorted(LAB_ALLOCATIONS))
def test_squeue_json_agrees_with_scontrol(tag: str) -> None:
    # squeue --json (openapi v0.0.38) of the same snapshot: gres_detail one entry per node
    records = squeue(LAB, f"squeue-{tag}.json")
    assert rejected(records) == []
    assert allocations(records) == allocations(scontrol(tag)) == LAB_ALLOCATIONS[tag]
    assert pending(records) == pending(scontrol(tag)) == LAB_PENDING[tag]


@pytest.mark.parametrize(
    "name", ["slurmrestd-slurm-v0.0.38-jobs-running.json", "slurmrestd-slurm-v0.0.38-job-running.json"]
)
def test_slurmrestd_v0038_jobs(name: str) -> None:
    records = squeue(LAB, name)
    assert allocations(records) == LAB_ALLOCATIONS["single-running-gpu2"]
    assert len(records) == 2


def sw(version: str, name: str) -> list:
    return squeue("slurm_web", version, name)


def epoch(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# Read by hand from slurm_web/<version>/slurm-job-gpus-*.json: job_id, submit_time.number,
# nodes and gres_detail
SLURM_WEB_GPU_JOBS = {
    ("24.05/0.0.41", "gres"): held(16, "gpu1", range(4), epoch(1762529703)),
    ("24.05/0.0.41", "multi-nodes"): held(11, "gpu1", range(4), epoch(1762529688))
    | held(11, "gpu2", range(4), epoch(1762529688)),
    ("24.05/0.0.41", "multi-types"): held(4, "gpu1", (0,), epoch(1762529638)),
    ("24.05/0.0.41", "per-node"): held(13, "gpu1", (0,), epoch(1762529694))
    | held(13, "gpu2", (0,), epoch(1762529694)),
    ("24.05/0.0.41", "running"): held(9, "gpu1", range(4), epoch(1762529652)),
    # "gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)": two types on one node
    ("24.11/0.0.42", "gres"): held(6353, "ia1", (0, 1), epoch(1762788120))
    | held(6353, "ia1", range(2, 6), epoch(1762788120), "h200"),
    ("24.11/0.0.42", "multi-nodes"): held(6371, "ia1", (0, 1), epoch(1762788887))
    | held(6371, "ia1", range(2, 6), epoch(1762788887), "h200")
    | held(6371, "ia2", (0, 1), epoch(1762788887))
    | held(6371, "ia2", range(2, 6), epoch(1762788887), "h200"),
    ("24.11/0.0.42", "multi-types"): held(6356, "ia1", (0,), epoch(1762788763))
    | held(6356, "ia1", (2,), epoch(1762788763), "h200"),
    # "gpu:h100:1(IDX:0),gpu:h200:0(IDX:)" on each of ia[1-2]
    ("24.11/0.0.42", "per-node"): held(6377, "ia1", (0,), epoch(1762788936))
    | held(6377, "ia2", (0,), epoch(1762788936)),
    ("24.11/0.0.42", "running"): held(6374, "ia1", (0, 1), epoch(1762788927))
    | held(6374, "ia1", range(2, 6), epoch(1762788927), "h200"),
    ("25.05/0.0.43", "gres"): held(4728, "gpu1", range(4), epoch(1762788989)),
    ("25.05/0.0.43", "multi-nodes"): held(4746, "gpu1", range(4), epoch(1762789125))
    | held(4746, "gpu2", range(4), epoch(1762789125)),
    ("25.05/0.0.43", "multi-types"): held(4752, "gpu1", (0,), epoch(1762789172)),
    ("25.05/0.0.43", "per-node"): held(4744, "gpu1", (0,), epoch(1762789118))
    | held(4744, "gpu2", (0,), epoch(1762789118)),
    ("25.05/0.0.43", "running"): held(4751, "gpu1", range(4), epoch(1762789168)),
    ("25.11/0.0.44", "gres"): held(5602, "gpu1", range(4), epoch(1762784672)),
    ("25.11/0.0.44", "multi-nodes"): held(5679, "gpu1", range(4), epoch(1762788040))
    | held(5679, "gpu2", range(4), epoch(1762788040)),
    ("25.11/0.0.44", "multi-types"): held(4716, "gpu1", (0,), epoch(1762783613)),
    ("25.11/0.0.44", "per-node"): held(5680, "gpu1", (0,), epoch(1762788044))
    | held(5680, "gpu2", (0,), epoch(1762788044)),
    ("25.11/0.0.44", "running"): held(5557, "gpu2", range(4), epoch(1762784646)),
}


@pytest.mark.parametrize(("version", "kind"), sorted(SLURM_WEB_GPU_JOBS))
def test_slurmrestd_gpu_jobs_v0041_to_v0044(version: str, kind: str) -> None:
    records = sw(version, f"slurm-job-gpus-{kind}.json")
    assert rejected(records) == []
    assert allocations(records) == SLURM_WEB_GPU_JOBS[(version, kind)]
    assert len(records) == len(SLURM_WEB_GPU_JOBS[(version, kind)])


# slurm_web/<version>/slurm-job-pending.json: one job pending on BeginTime (begin = submit + 1 h)
SLURM_WEB_PENDING = {
    "24.05/0.0.41": (649730, "tmcgrath", "admin", "batch", 1747754494),
    "24.11/0.0.42": (6370, "jbeck", "biology", "standard", 1762788785),
    "25.05/0.0.43": (4743, "progers", "biology", "normal", 1762789015),
    "25.11/0.0.44": (5750, "vhartman", "biology", "normal", 1762942475),
}


@pytest.mark.parametrize("version", sorted(SLURM_WEB_PENDING))
def test_slurmrestd_pending_and_cpu_jobs(version: str) -> None:
    job, user, account, partition, submit = SLURM_WEB_PENDING[version]
    # no gres: this dev cluster does not account gres/gpu and the job asks for none
    assert pending(sw(version, "slurm-job-pending.json")) == [
        (job, str(job), user, account, partition, "BeginTime", 0, epoch(submit), epoch(submit + 3600))
    ]
    # a running CPU-only job holds no GPU
    assert sw(version, "slurm-job-running.json") == []


def test_slurmrestd_jobs_list_v0044() -> None:
    # GET /slurm/v0.0.44/jobs: 15 jobs (7 COMPLETED, 4 RUNNING without GPUs, CANCELLED, TIMEOUT,
    # FAILED, 1 PENDING)
    records = sw("25.11/0.0.44", "slurm-jobs.json")
    assert pending(records) == [
        (5750, "5750", "vhartman", "biology", "normal", "BeginTime", 0, epoch(1762942475), epoch(1762946075))
    ]
    assert len(records) == 1


def test_v0040_and_v0037_pending_array_jobs() -> None:
    # lcrownover: /slurm/v0.0.40/jobs of Slurm 23.11.1; a running array task without GPUs and
    # the pending rest of the array (array_task_string "412-9999")
    records = squeue("lcrownover_slurm_exporter", "V0040OpenapiJobInfoResp.json")
    assert pending(records) == [
        (
            7725337,
            "7725337_[412-9999]",
            "rdennis",
            "jamming",
            "preempt",
            "Resources",
            0,
            epoch(1722268317),
            epoch(1722268326),
        )
    ]
    assert len(records) == 1
    # rivosinc: squeue --json of 21.08.5 (v0.0.37), eligible_time 0 -> unknown
    records = squeue("rivosinc_slurm_exporter", "squeue_out.json")
    assert pending(records) == [
        (58948420, "58948420_[1-10]", "bkd", "account1", "hw-m", "Dependency", 0, epoch(1729715848), None)
    ]
    assert len(records) == 1


def test_squeue_json_bad_job_is_rejected_rest_kept() -> None:
    # the real multinode capture with one gres_detail entry removed: 1 entry for 2 nodes
    document = json.loads(read(LAB, "squeue-multinode-running.json"))
    running = next(job for job in document["jobs"] if job["job_state"] == "RUNNING")
    running["gres_detail"] = running["gres_detail"][:1]
    records = parse_squeue_json(json.dumps(document), cluster="lab", at=AT)
    (bad,) = records
    assert isinstance(bad, Rejected)
    assert (bad.record_key, bad.origin) == ("job 2", "squeue --json")
    assert bad.reason == "gres_detail has 1 entries for 2 nodes in 'gpu[01-02]'"
    assert json.loads(bad.raw)["job_id"] == 2


def test_squeue_json_whole_input_errors() -> None:
    text = read(LAB, "squeue-running-1.json")
    with pytest.raises(ParseError, match="not JSON"):
        parse_squeue_json(text[: len(text) // 2], cluster="lab", at=AT)
    # an error document (the real envelope with an error entry) must not read as an empty queue
    document = json.loads(text)
    document["jobs"] = []
    document["errors"] = [
        {"error": "Unable to contact slurm controller (connect failure)", "error_number": 1007}
    ]
    with pytest.raises(ParseError, match="connect failure"):
        parse_squeue_json(json.dumps(document), cluster="lab", at=AT)
    with pytest.raises(ParseError, match="no 'jobs' list"):
        parse_squeue_json(read(LAB, "sinfo-running-1.json"), cluster="lab", at=AT)


# --------------------------------------------------------------------------- nodes


def node_view(records: list) -> list[tuple]:
    assert rejected(records) == []
    return [
        (r.node, r.states, r.gpus_total, r.gpus_allocated, r.partitions, r.gpu_model, r.reason)
        for r in records
        if isinstance(r, NodeState)
    ]


BOTH = ("gpu", "debug")
# Read by hand from scontrol-show-node-d-TAG.txt: State=, Gres=, GresUsed=
LAB_NODES = {
    "running-1": [
        ("gpu01", ("MIXED",), 4, 4, BOTH, "h100", ""),
        ("gpu02", ("MIXED",), 4, 4, BOTH, "h100", ""),
    ],
    "running-3": [
        ("gpu01", ("MIXED",), 4, 3, BOTH, "h100", ""),
        ("gpu02", ("MIXED",), 4, 4, BOTH, "h100", ""),
    ],
    "nodedown": [("gpu01", ("MIXED",), 4, 3, BOTH, "h100", ""), ("gpu02", ("IDLE",), 4, 0, BOTH, "h100", "")],
    "final": [("gpu01", ("IDLE",), 4, 0, BOTH, "h100", ""), ("gpu02", ("IDLE",), 4, 0, BOTH, "h100", "")],
    "multinode-running": [
        ("gpu01", ("MIXED",), 4, 2, BOTH, "h100", ""),
        ("gpu02", ("MIXED",), 4, 2, BOTH, "h100", ""),
    ],
}


@pytest.mark.parametrize("tag", sorted(LAB_NODES))
def test_scontrol_show_node_golden(tag: str) -> None:
    records = parse_scontrol_nodes(read(LAB, f"scontrol-show-node-d-{tag}.txt"), cluster="lab", at=AT)
    assert node_view(records) == LAB_NODES[tag]
    assert all(isinstance(r, NodeState) and r.cluster == "lab" and r.observed_at == AT for r in records)


@pytest.mark.parametrize("tag", ["running-1", "running-3", "nodedown", "final"])
def test_sinfo_json_agrees_with_scontrol_show_node(tag: str) -> None:
    records = parse_sinfo_json(read(LAB, f"sinfo-{tag}.json"), cluster="lab", at=AT)
    assert node_view(records) == LAB_NODES[tag]


def test_sinfo_json_running_2_and_slurmrestd_v0038_nodes() -> None:
    assert (
        node_view(parse_sinfo_json(read(LAB, "sinfo-running-2.json"), cluster="lab", at=AT))
        == LAB_NODES["running-1"]
    )
    # captured after the scenario: both idle
    assert (
        node_view(parse_sinfo_json(read(LAB, "slurmrestd-slurm-v0.0.38-nodes.json"), cluster="lab", at=AT))
        == LAB_NODES["final"]
    )


def test_scontrol_node_reason_stamp_is_removed() -> None:
    # the real gpu02 record, set DOWN+DRAIN with the Reason line scontrol prints for a reason
    # an admin set ("<text> [<user>@<time>]")
    text = read(LAB, "scontrol-show-node-d-nodedown.txt")
    gpu01, gpu02 = text.rstrip("\n").split("\n\n")
    assert gpu02.startswith("NodeName=gpu02 ") and "State=IDLE " in gpu02
    gpu02 = gpu02.replace("State=IDLE ", "State=DOWN+DRAIN ") + (
        "\n   Reason=scenario node failure [root@2026-12-02T13:01:58]"
    )
    records = parse_scontrol_nodes(gpu01 + "\n\n" + gpu02 + "\n", cluster="lab", at=AT)
    assert node_view(records) == [
        ("gpu01", ("MIXED",), 4, 3, BOTH, "h100", ""),
        ("gpu02", ("DOWN", "DRAIN"), 4, 0, BOTH, "h100", "scenario node failure"),
    ]


def test_clockwork_scontrol_show_node_without_detail() -> None:
    # Slurm 20.11 `scontrol show node` (no -d): no GresUsed, so AllocTRES gres/gpu gives the use;
    # Gres=(null) / Gres=justarandomfield fall back to CfgTRES gres/gpu (hand-edited upstream)
    parts = (
        "unkillable",
        "short-unkillable",
        "main",
        "main-grace",
        "long",
        "long-grace",
        "cpu_jobs_low",
        "cpu_jobs_low-grace",
    )
    assert node_view(parse_scontrol_nodes(read("clockwork", "scontrol_node_2.txt"), cluster="c", at=AT)) == [
        ("test-node", ("MIXED",), 8, 8, parts, "rtx8000", ""),
        ("test-node-2", ("MIXED",), 8, 8, parts, "rtx8000", ""),
    ]
    assert node_view(parse_scontrol_nodes(read("clockwork", "scontrol_node_3.txt"), cluster="c", at=AT)) == [
        ("test-node-1", ("MIXED",), 8, 8, parts, "", ""),
        ("test-node-2", ("MIXED",), 8, 8, parts, "rtx8000", ""),
        ("test-node-3", ("MIXED",), 8, 8, parts, "v100", ""),
        ("test-node-4", ("MIXED",), 8, 8, parts, "not-an-existing-gpu", ""),
        ("test-node-5", ("MIXED",), 8, 8, parts, "", ""),
    ]


def nodes_of(*parts: str) -> list[tuple]:
    return node_view(parse_sinfo_json(read(*parts), cluster="c", at=AT))


def test_slurmrestd_nodes_v0042_to_v0044() -> None:
    assert nodes_of("slurm_web", "24.11/0.0.42", "slurm-nodes.json") == [
        ("cn1", ("IDLE",), 0, 0, ("standard",), "", ""),
        ("cn2", ("IDLE",), 0, 0, ("standard",), "", ""),
        ("cn3", ("DOWN",), 0, 0, ("standard",), "", "CPU dead"),
        ("cn4", ("IDLE", "DRAIN"), 0, 0, ("standard",), "", "ECC memory error"),
        # gres "gpu:h100:2,gpu:h200:4": two types, no single model
        ("ia1", ("IDLE", "COMPLETING"), 6, 0, ("ia",), "", ""),
        ("ia2", ("IDLE",), 6, 0, ("ia",), "", ""),
    ]
    assert nodes_of("slurm_web", "25.05/0.0.43", "slurm-nodes.json") == [
        ("cn1", ("IDLE",), 0, 0, ("normal",), "", ""),
        ("cn2", ("IDLE",), 0, 0, ("normal",), "", ""),
        ("cn3", ("IDLE", "DRAIN"), 0, 0, ("normal",), "", "ECC memory error"),
        ("cn4", ("DOWN",), 0, 0, ("normal",), "", "CPU dead"),
        ("gpu1", ("IDLE", "COMPLETING"), 4, 0, ("gpu",), "h100", ""),
        ("gpu2", ("IDLE",), 4, 0, ("gpu",), "h100", ""),
    ]
    assert nodes_of("slurm_web", "25.11/0.0.44", "slurm-nodes.json") == [
        ("cn1", ("IDLE", "DRAIN"), 0, 0, ("normal",), "", "ECC memory error"),
        ("cn2", ("DOWN",), 0, 0, ("normal",), "", "CPU dead"),
        ("cn3", ("ALLOCATED",), 0, 0, ("normal",), "", ""),
        ("cn4", ("MIXED",), 0, 0, ("normal",), "", ""),
        ("gpu1", ("IDLE",), 4, 0, ("gpu",), "h100", ""),
        ("gpu2", ("IDLE",), 4, 0, ("gpu",), "h100", ""),
        # untyped "gpu:4" / "gpu:0"
        ("gpu3", ("IDLE",), 4, 0, ("gpu",), "", ""),
        ("gpu4", ("IDLE",), 4, 0, ("gpu",), "", ""),
    ]


@pytest.mark.parametrize(
    ("version", "kind", "expected"),
    [
        ("24.05/0.0.41", "allocated", ("gpu1", ("ALLOCATED",), 4, 4, ("normal",), "h100", "")),
        ("24.11/0.0.42", "allocated", ("ia1", ("ALLOCATED",), 6, 6, ("standard",), "", "")),
        ("25.05/0.0.43", "allocated", ("gpu1", ("ALLOCATED",), 4, 4, ("gpu",), "h100", "")),
        ("25.05/0.0.43", "mixed", ("gpu1", ("MIXED",), 4, 1, ("gpu",), "h100", "")),
        ("25.11/0.0.44", "allocated", ("gpu1", ("ALLOCATED",), 4, 4, ("gpu",), "h100", "")),
        ("25.11/0.0.44", "mixed", ("gpu1", ("MIXED",), 4, 1, ("gpu",), "h100", "")),
    ],
)
def test_slurmrestd_node_with_gpus(version: str, kind: str, expected: tuple) -> None:
    assert nodes_of("slurm_web", version, f"slurm-node-with-gpus-model-{kind}.json") == [expected]


def test_v0040_nodes_with_mig_and_h100() -> None:
    # lcrownover /slurm/v0.0.40/nodes (Slurm 23.11.1): A100, MIG slices as a GPU type, H100,
    # "(S:0-1)" socket suffixes, "IDX:N/A", "gpu:0" on nodes without GPUs. A node of MIG slices
    # counts its physical GPUs: gpu:1g.10gb:21 (S:1) is 21 slices of 1/7 on 3 A100 80 GB (like
    # n0164's 3 whole ones), not 21 GPUs; in use, the GPUs the slices need at least
    assert nodes_of("lcrownover_slurm_exporter", "V0040OpenapiNodesResp.json") == [
        ("dtn1", ("DOWN", "NOT_RESPONDING"), 0, 0, (), "", "Not responding"),
        ("dtn2", ("DOWN", "NOT_RESPONDING"), 0, 0, (), "", "Not responding"),
        ("n0160", ("ALLOCATED",), 1, 1, ("gpu", "preempt"), "nvidia_a100_80gb_pcie", ""),
        ("n0161", ("ALLOCATED",), 3, 1, ("interactivegpu", "preempt"), "1g.10gb", ""),
        # gres_used "gpu:1g.10gb:9(IDX:0-3,5-9)": 9 slices, at least 2 GPUs
        ("n0162", ("MIXED",), 3, 2, ("gpu", "gpulong", "preempt"), "1g.10gb", ""),
        ("n0163", ("ALLOCATED",), 3, 1, ("gpu", "gpulong", "preempt"), "1g.10gb", ""),
        (
            "n0164",
            ("IDLE", "DRAIN"),
            3,
            0,
            ("gpu", "gpulong", "preempt"),
            "nvidia_a100_80gb_pcie",
            "Kill task failed",
        ),
        ("n0397", ("ALLOCATED",), 0, 0, ("preempt", "amt"), "", ""),
        ("n0398", ("ALLOCATED",), 0, 0, ("interactive", "preempt"), "", ""),
        ("n0399", ("ALLOCATED",), 0, 0, ("interactive", "preempt"), "", ""),
        ("n0999", ("IDLE", "DRAIN"), 4, 0, ("preempt", "cisds"), "nvidia_h100_80gb_hbm3", "gpu_board"),
        ("n1000", ("MIXED",), 8, 0, ("kerngpu",), "nvidia_h100_80gb_hbm3", ""),
    ]


def test_v0040_mig_nodes_count_allocated_gpus_as_their_total_without_gres_used() -> None:
    """The same real nodes as `scontrol show node` without -d gives them: no GresUsed, so the
    allocation is read from AllocTRES (`tres_used` here), which counts GRES, i.e. slices on a
    MIG node (n0162: gres/gpu=9). Read as the node's GRES types, it is in the unit of the total,
    physical GPUs, and equals what GresUsed gives: 9 slices of 1g.10gb need at least 2 A100s."""
    document = json.loads(read("lcrownover_slurm_exporter", "V0040OpenapiNodesResp.json"))
    for node in document["nodes"]:
        node.pop("gres_used", None)
    without = node_view(parse_sinfo_json(json.dumps(document), cluster="c", at=AT))
    with_gres_used = nodes_of("lcrownover_slurm_exporter", "V0040OpenapiNodesResp.json")
    assert without == with_gres_used
    mig = {n[0]: (n[2], n[3]) for n in without if n[5] == "1g.10gb"}
    assert mig == {"n0161": (3, 1), "n0162": (3, 2), "n0163": (3, 1)}


@pytest.mark.parametrize(
    ("tres", "gres", "gpus"),
    [
        # untyped counts on a node of one type: whole GPUs as counted, slices as shares
        ("cpu=26,mem=501632M,gres/gpu=9", "gpu:1g.10gb:21(S:1)", 2),
        ("cpu=5,mem=1280M,gres/gpu=4,gres/gpu:h100=4", "gpu:h100:4", 4),
        ("cpu=1,mem=256M,gres/gpu=1", "gpu:h100:4", 1),
        ("cpu=2", "gpu:h100:4", 0),
        # typed entries (AccountingStorageTRES=gres/gpu:TYPE), several MIG profiles on a node
        (
            "cpu=38,mem=252032M,gres/gpu=3,gres/gpu:3g.40gb=2,gres/gpu:4g.40gb=1",
            "gpu:3g.40gb:4,gpu:4g.40gb:2",
            2,
        ),
        # MIG types after the GPU's name; a whole A100 beside the slices
        ("cpu=76,gres/gpu=4,gres/gpu:a100=2,gres/gpu:a100_1g.5gb=2", "gpu:a100:2,gpu:a100_1g.5gb:14", 3),
        # untyped on a node of several types: its smallest slices first (the least share)
        ("gres/gpu=3", "gpu:1g.10gb:7,gpu:3g.40gb:2", 1),
        ("gres/gpu=9", "gpu:1g.10gb:7,gpu:3g.40gb:2", 2),
        # no Gres at all (CfgTRES alone): whole GPUs
        ("gres/gpu=8", "", 8),
    ],
)
def test_tres_gpu_counts_are_read_in_the_unit_of_the_nodes_gres(tres: str, gres: str, gpus: int) -> None:
    from slurmtel.parsers.gres import gpu_items, physical_gpus, tres_gpu_items
    from slurmtel.parsers.slurm_common import parse_tres_string

    assert physical_gpus(tres_gpu_items(parse_tres_string(tres), gpu_items(gres))) == gpus


@pytest.mark.parametrize(
    ("gpu_type", "slices"),
    [
        ("1g.10gb", (1, 7)),
        ("3g.40gb", (3, 7)),
        ("1c.3g.71gb", (1, 7)),
        ("1g.10gb+me", (1, 7)),
        ("2g.12gb", (2, 4)),  # an A30: 6 GB a slice, 4 slices
        ("a100_3g.20gb", (3, 7)),
        ("nvidia_a100_1g.5gb", (1, 7)),
        ("nvidia_a100_80gb_pcie", None),
        ("h100", None),
    ],
)
def test_mig_profiles_are_known_with_or_without_the_gpus_name(gpu_type: str, slices: tuple | None) -> None:
    from slurmtel.parsers.gres import mig_slices

    assert mig_slices(gpu_type) == slices


MIG_LAB = "slurm-22.05-mig"


@pytest.mark.parametrize(
    "capture",
    [
        "scontrol-show-node-mig.txt",  # no GresUsed: AllocTRES=...,gres/gpu=3 counts slices
        "scontrol-show-node-d-mig.txt",
        "scontrol-show-node-o-mig.txt",
        "sinfo-json-mig.json",
    ],
)
def test_a_mig_node_of_the_lab_has_its_allocated_gpus_in_the_unit_of_its_total(capture: str) -> None:
    """The lab's gpu02 as a node of four 1g.10gb instances, three of them held by job 30: one
    physical GPU, and one in use (the 3 slices need 1), on every form scontrol and sinfo print."""
    raw = read(MIG_LAB, capture)
    records = (
        parse_sinfo_json(raw, cluster="lab", at=AT)
        if capture.endswith(".json")
        else (parse_scontrol_nodes(raw, cluster="lab", at=AT))
    )
    assert [(n.node, n.gpus_total, n.gpus_allocated, n.gpu_model) for n in records] == [
        ("gpu01", 4, 1, "h100"),
        ("gpu02", 1, 1, "1g.10gb"),
    ]


def test_the_mig_jobs_of_the_lab_hold_slice_indices_on_both_job_views() -> None:
    """squeue --json and scontrol show job -d say the same: job 30 holds MIG devices 0-2 of gpu02
    (indices in gres.conf order, typed 1g.10gb), job 31 the H100 0 of gpu01."""
    views = [
        parse_squeue_json(read(MIG_LAB, "squeue-json-mig.json"), cluster="lab", at=AT),
        parse_scontrol_jobs(read(MIG_LAB, "scontrol-show-job-d-mig.txt"), cluster="lab", at=AT),
    ]
    for records in views:
        held = sorted(
            (a.job_id_raw, a.node, a.gpu_index, a.gpu_model) for a in records if isinstance(a, GpuAllocation)
        )
        assert held == [
            (30, "gpu02", 0, "1g.10gb"),
            (30, "gpu02", 1, "1g.10gb"),
            (30, "gpu02", 2, "1g.10gb"),
            (31, "gpu01", 0, "h100"),
        ]


def test_v0037_sinfo_json() -> None:
    # 21.08 sinfo --json: lowercase state plus state_flags
    assert nodes_of("rivosinc_slurm_exporter", "sinfo_out.json") == [
        ("cs2.example.company.com", ("MIXED",), 0, 0, ("hw",), "", ""),
        ("cs3.example.company.com", ("IDLE",), 0, 0, ("hw",), "", ""),
        ("cs4.example.company.com", ("ALLOCATED",), 0, 0, ("hw",), "", ""),
        ("cs5.example.company.com", ("DOWN",), 0, 0, ("hw",), "", ""),
    ]
    assert nodes_of("clockwork", "sinfo_1.json") == [
        ("test-node-1", ("DOWN", "NOT_RESPONDING"), 1, 0, ("debug",), "", "Not responding"),
        ("test-node-2", ("DOWN", "DRAIN"), 0, 0, ("debug",), "", "Sanity Check Failed"),
    ]


def test_sinfo_json_whole_input_errors() -> None:
    with pytest.raises(ParseError, match="no 'nodes' list"):
        parse_sinfo_json(read(LAB, "squeue-running-1.json"), cluster="lab", at=AT)
    # sinfo --json of 23.02+ prints {"sinfo": [...]} grouped by node state: refused with a hint
    with pytest.raises(ParseError, match="scontrol show nodes --json"):
        parse_sinfo_json('{"sinfo": [], "errors": [], "warnings": []}', cluster="lab", at=AT)


# --------------------------------------------------------------------------- 24.11 and 26.05

AT_2611 = datetime(2026, 12, 3, 14, 5, 0, tzinfo=UTC)
S_2611 = utc("2026-12-03T14:04:24")
# Read by hand from slurm-24.11/squeue-running.json (gres_detail, one entry per node of `nodes`);
# 26.05's capture of the same scenario differs only in the requeued job's id (48, not 46)
RUNNING_2411 = (
    held(35, "gpu01", (0, 1), S_2611)
    | held(36, "gpu02", (0,), S_2611)
    | held(37, "gpu01", (2,), S_2611)
    | held(37, "gpu02", (1,), S_2611)
    | held(38, "gpu02", (2,), S_2611)
    | held(39, "gpu02", (3,), S_2611)
)
RUNNING = {
    "24.11": RUNNING_2411 | held(46, "gpu01", (3,), S_2611),
    "26.05": RUNNING_2411 | held(48, "gpu01", (3,), S_2611),
}
PENDING_2611 = [
    (42, "42", "JobHeldUser", 1),
    (43, "43", "BeginTime", 1),
    (44, "44_[1-3%1]", "BeginTime", 1),
    (45, "45", "Resources", 4),
]
NOTICE_2605 = SchemaNotice("slurmctld", "squeue --json", "data_parser/v0.0.45", "data_parser/v0.0.44")


def notices(records: list) -> list[SchemaNotice]:
    return [r for r in records if isinstance(r, SchemaNotice)]


@pytest.mark.parametrize("version", ("24.11", "26.05"))
def test_squeue_json_of_24_11_and_26_05(version: str) -> None:
    lab = f"slurm-{version}"
    records = parse_squeue_json(read(lab, "squeue-running.json"), cluster="lab", at=AT_2611)
    # 26.05 prints data_parser/v0.0.45, newer than any slurmtel knows: read by v0.0.44's shape,
    # with a notice first; 24.11's v0.0.42 is known
    assert notices(records) == ([NOTICE_2605] if version == "26.05" else [])
    if version == "26.05":
        assert records[0] == NOTICE_2605
    assert rejected(records) == []
    assert allocations(records) == RUNNING[version]
    assert [(p[0], p[1], p[5], p[6]) for p in pending(records)] == PENDING_2611
    # the same moment as scontrol show job -d prints it (both layouts): the same GPUs and queue
    for name in ("scontrol-show-job-d-running.txt", "scontrol-show-job-d-oneliner-running.txt"):
        text_view = parse_scontrol_jobs(read(lab, name), cluster="lab", at=AT_2611)
        assert allocations(text_view) == RUNNING[version]
        assert pending(text_view) == pending(records)
    # an empty queue is an empty result (and still the notice)
    for name in ("squeue-a-empty.json", "squeue-a-final.json"):
        empty = parse_squeue_json(read(lab, name), cluster="lab", at=AT_2611)
        assert [r for r in empty if not isinstance(r, SchemaNotice)] == []
        assert len(notices(empty)) == (version == "26.05")


@pytest.mark.parametrize("version", ("24.11", "26.05"))
def test_nodes_of_24_11_and_26_05(version: str) -> None:
    lab = f"slurm-{version}"
    records = parse_scontrol_nodes(read(lab, "scontrol-show-node-d-running.txt"), cluster="lab", at=AT_2611)
    assert [
        (n.node, n.states, n.gpus_total, n.gpus_allocated, n.partitions, n.gpu_model) for n in records
    ] == [
        ("gpu01", ("MIXED", "PLANNED"), 4, 4, ("gpu", "debug"), "h100"),
        ("gpu02", ("MIXED",), 4, 4, ("gpu", "debug"), "h100"),
    ]
    # every GPU index the jobs hold is one the nodes say is in use
    assert {(a[1], a[2]) for a in RUNNING[version]} == {(n, i) for n in ("gpu01", "gpu02") for i in range(4)}
    # the sinfo document of both groups nodes by state: refused, with the way to per-node JSON
    with pytest.raises(ParseError, match="scontrol show nodes --json"):
        parse_sinfo_json(read(lab, "sinfo-running.json"), cluster="lab", at=AT_2611)


def test_node_json_of_a_newer_schema_is_read_with_a_notice() -> None:
    # the real 25.11 (v0.0.44) node list, as a 26.05 slurmrestd would name it
    document = json.loads(read("slurm_web", "25.11", "0.0.44", "slurm-nodes.json"))
    known = parse_sinfo_json(json.dumps(document), cluster="c", at=AT)
    assert notices(known) == []
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.45"
    newer = parse_sinfo_json(json.dumps(document), cluster="c", at=AT, origin="nodes")
    assert newer[0] == SchemaNotice("slurmctld", "nodes", "data_parser/v0.0.45", "data_parser/v0.0.44")
    assert newer[1:] == known
    assert [(n.node, n.gpus_total) for n in newer[1:] if isinstance(n, NodeState)][-4:] == [
        ("gpu1", 4),
        ("gpu2", 4),
        ("gpu3", 4),
        ("gpu4", 4),
    ]


def test_an_unknown_schema_whose_objects_match_no_shape_is_refused() -> None:
    # sacct --json of 26.05 (v0.0.45 too, a 'jobs' list): its jobs have no job_state
    sacct = FIXTURES.parent / "sacct" / "slurm-26.05" / "sacct-a-D-X-final.json"
    with pytest.raises(
        ParseError, match=r"unknown slurmctld JSON schema 'data_parser/v0\.0\.45'.*job objects"
    ):
        parse_squeue_json(sacct.read_text(), cluster="lab", at=AT)
    # a node list of a name never seen whose objects have no node's shape
    document = json.loads(read("slurm-26.05", "squeue-a-empty.json"))
    document["meta"]["plugin"]["data_parser"] = "data_parser/v1.0.0"
    document["nodes"] = [{"hostname": "gpu01"}, {"hostname": "gpu02"}]
    with pytest.raises(
        ParseError, match=r"unknown slurmctld JSON schema 'data_parser/v1\.0\.0'.*node objects"
    ):
        parse_sinfo_json(json.dumps(document), cluster="lab", at=AT)
    # a known schema is read object by object as before: the odd ones quarantined alone
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.44"
    assert [r.reason for r in rejected(parse_sinfo_json(json.dumps(document), cluster="lab", at=AT))] == [
        "node without a name",
        "node without a name",
    ]
    # one object of the known shape among odd ones: read, the others quarantined
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.45"
    document["nodes"].append(json.loads(read("slurm_web", "25.11", "0.0.44", "slurm-nodes.json"))["nodes"][4])
    records = parse_sinfo_json(json.dumps(document), cluster="lab", at=AT)
    assert [type(r).__name__ for r in records] == ["SchemaNotice", "Rejected", "Rejected", "NodeState"]


# --------------------------------------------------------------------------- GRES strings


@pytest.mark.parametrize(
    ("text", "items"),
    [
        # slurm-22.05 scontrol show job -d / show node -d
        ("gpu:h100:2(IDX:2-3)", [GresItem("gpu", "h100", 2, (2, 3))]),
        ("gpu:h100:0(IDX:N/A)", [GresItem("gpu", "h100", 0, ())]),
        ("gpu:h100:4", [GresItem("gpu", "h100", 4)]),
        ("gres:gpu:1", [GresItem("gpu", "", 1)]),
        # lcrownover V0040 nodes
        ("gpu:1g.10gb:9(IDX:0-3,5-9)", [GresItem("gpu", "1g.10gb", 9, (0, 1, 2, 3, 5, 6, 7, 8, 9))]),
        ("gpu:nvidia_h100_80gb_hbm3:8(S:0-1)", [GresItem("gpu", "nvidia_h100_80gb_hbm3", 8)]),
        ("gpu:0", [GresItem("gpu", "", 0)]),
        # slurm_web 24.11 gres_detail / tres_per_node
        (
            "gpu:h100:1(IDX:0),gpu:h200:0(IDX:)",
            [GresItem("gpu", "h100", 1, (0,)), GresItem("gpu", "h200", 0, ())],
        ),
        ("gres/gpu:h100:1,gres/gpu:h200:1", [GresItem("gpu", "h100", 1), GresItem("gpu", "h200", 1)]),
        # clockwork
        ("gpu:titanxp:1", [GresItem("gpu", "titanxp", 1)]),
        ("gpu:0,tpu:0", [GresItem("gpu", "", 0), GresItem("tpu", "", 0)]),
        ("justarandomfield", [GresItem("justarandomfield", "", 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres_real_strings(text: str, items: list[GresItem]) -> None:
    assert parse_gres(text) == items


def test_parse_index_list() -> None:
    assert parse_index_list("0-1,3") == (0, 1, 3)
    assert parse_index_list("N/A") == ()
    with pytest.raises(ValueError, match="bad index range"):
        parse_index_list("3-1")


def test_scontrol_node_with_unreadable_gres_is_rejected() -> None:
    # the real running-1 text with gpu01's Gres damaged (a type field too many)
    text = read(LAB, "scontrol-show-node-d-running-1.txt").replace(
        "Gres=gpu:h100:4\n", "Gres=gpu:h100:x:4\n", 1
    )
    records = parse_scontrol_nodes(text, cluster="lab", at=AT)
    bad, good = records
    assert isinstance(bad, Rejected) and isinstance(good, NodeState)
    assert (bad.record_key, bad.origin, bad.reason) == (
        "node gpu01",
        "scontrol show node -d",
        "cannot read GRES 'gpu:h100:x:4' in 'gpu:h100:x:4'",
    )
    assert bad.raw.startswith("NodeName=gpu01 ")
    assert (good.node, good.gpus_total, good.gpus_allocated) == ("gpu02", 4, 4)
