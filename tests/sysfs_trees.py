"""Build sysfs trees in a tmp directory from the real captures (tests/fixtures/infiniband)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import fixture_path

GPUD_TREE = fixture_path("infiniband", "sysfs_gpud_h100_class_infiniband")
NODE_EXPORTER_TTAR = fixture_path("infiniband", "sysfs_node_exporter_sys_ttar_infiniband_subset.ttar")
PROCFS_TTAR = fixture_path("infiniband", "sysfs_procfs_fixtures_ttar_infiniband_subset.ttar")


def gpud_sysfs(root: Path) -> Path:
    """ROOT/class/infiniband = the gpud H100 node's tree (9 HCAs); returns ROOT."""
    target = root / "class" / "infiniband"
    shutil.copytree(GPUD_TREE, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def untar(ttar: Path, root: Path, strip: str) -> Path:
    """Extract a ttar archive (prometheus' text tar: `Path:`/`Lines:`/content/`Mode:`) under
    ROOT, dropping the leading STRIP from its paths ("sys/", "fixtures/sys/"); returns ROOT."""
    lines = ttar.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Directory: "):
            (root / line[len("Directory: ") :].removeprefix(strip)).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = root / line[len("Path: ") :].removeprefix(strip)
            count = int(lines[i + 1].split(": ", 1)[1])
            body = lines[i + 2 : i + 2 + count]
            text = "\n".join(body) + "\n"
            if body and body[-1].endswith("EOF"):
                text = text[: -len("EOF\n")]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            i += 1 + count
        i += 1
    return root


def set_counter(root: Path, device: str, port: int, name: str, value: int, group: str = "counters") -> None:
    (root / "class" / "infiniband" / device / "ports" / str(port) / group / name).write_text(f"{value}\n")


def counter(root: Path, device: str, port: int, name: str, group: str = "counters") -> int:
    return int((root / "class" / "infiniband" / device / "ports" / str(port) / group / name).read_text())


# ---------------------------------------------------------------- Slurm job cgroups (tests/fixtures/cgroup)

SLURM_V2_TTAR = fixture_path("cgroup", "treydock_cgroup_exporter_slurm_v2_job_4.ttar")
SLURM_V1_TTAR = fixture_path("cgroup", "treydock_cgroup_exporter_slurm_v1_jobs_10_11.ttar")


def slurm_v2_cgroup(root: Path) -> Path:
    """ROOT = a cgroup v2 mount holding the real Slurm job_4 tree; returns ROOT."""
    untar(SLURM_V2_TTAR, root, "fixtures/")
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return root


def v2_job(root: Path, job_id: str) -> Path:
    return root / "system.slice" / "slurmstepd.scope" / f"job_{job_id}"


def clone_v2_job(root: Path, source: str, job_id: str) -> Path:
    """A second job with the files of SOURCE (a job that starts while the agent runs)."""
    target = v2_job(root, job_id)
    shutil.copytree(v2_job(root, source), target)
    return target


def write_job_files(job: Path, **files: str) -> None:
    """Set a job's cgroup files: io_stat="...", io_pressure="..." ('_' for '.')."""
    for name, body in files.items():
        (job / name.replace("_", ".", 1)).write_text(body)
