"""The installed package has everything a checkout has (pyproject lists packages by hand,
because migrations/ ships inside the package as slurmtel.migrations), and a GPU node installs
only the agent: the base dependencies are exactly what slurmtel-agent imports, the `head` extra
the head's packages, and without them `slurmtel` says to install slurmtel[head]."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "slurmtel").rglob("__init__.py")
    } | {"slurmtel.migrations", "slurmtel.migrations.versions"}
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "pyproject lists packages that do not exist"
    assert setuptools["package-dir"]["slurmtel.migrations"] == "migrations"


def test_package_data_covers_the_data_files() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*" in data["slurmtel"]
    assert {"script.py.mako", "versions/*.py"} <= set(data["slurmtel.migrations"])
    assert list((ROOT / "slurmtel" / "data").glob("*.json"))


# --- a node installs only the agent ----------------------------------------------------------

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# the head's packages, by the name they are imported under
HEAD_IMPORTS = (
    "sqlalchemy",
    "psycopg",
    "alembic",
    "apscheduler",
    "pgserver",
    "matplotlib",
    "rich",
    "hostlist",
    "starlette",
    "uvicorn",
    "jinja2",
    "markupsafe",
    "h11",
    "anyio",
)
# import name -> distribution, where they differ (importlib.metadata knows only installed ones)
DISTRIBUTION = {
    "pynvml": "nvidia-ml-py",
    "prometheus_client": "prometheus-client",
    "hostlist": "python-hostlist",
    "yaml": "pyyaml",
}

# blocks the head's packages in a child interpreter, as on a node that installed only the agent
BLOCK_HEAD = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports(roots: Iterable[str]) -> dict[str, str]:
    """Import name -> a module importing it, over every slurmtel module reachable from ROOTS
    (their imports, top-level and in functions, followed through slurmtel)."""
    from test_layers import IMPORTS, MODULES

    seen: set[str] = set()
    todo = list(roots)
    found: dict[str, str] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for target, _ in IMPORTS[module]:
            top = target.split(".")[0]
            if top == "slurmtel":
                todo.append(target if target in MODULES else target.rsplit(".", 1)[0])
            elif top and top not in sys.stdlib_module_names:
                found.setdefault(top, module)
    return found


def _distributions(imports: Iterable[str]) -> set[str]:
    return {DISTRIBUTION.get(name, name).lower().replace("_", "-") for name in imports}


def test_base_dependencies_are_exactly_what_the_agent_imports() -> None:
    from test_layers import MODULES

    agent = _third_party_imports(m for m in MODULES if m.startswith("slurmtel.agent"))
    base = {_name(r) for r in PYPROJECT["dependencies"]}
    nvml = {_name(r) for r in PYPROJECT["optional-dependencies"]["nvml"]}
    assert _distributions(agent) == base | nvml, agent
    assert not set(agent) & set(HEAD_IMPORTS), agent


def test_the_head_extra_covers_the_rest() -> None:
    from test_layers import MODULES

    everything = _third_party_imports(MODULES)
    extras = PYPROJECT["optional-dependencies"]
    declared = {_name(r) for r in PYPROJECT["dependencies"]}
    for extra in ("head", "nvml", "pyslurm", "parquet"):
        declared |= {_name(r) for r in extras[extra]}
    undeclared = {name: module for name, module in everything.items() if _distributions([name]) - declared}
    assert undeclared == {}, "imported but in no dependency list"
    head = {_name(r) for r in extras["head"]}
    assert head == _distributions(HEAD_IMPORTS)
    assert not head & {_name(r) for r in PYPROJECT["dependencies"]}


def _run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_HEAD.format(blocked=set(HEAD_IMPORTS)) + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_agent_runs_without_the_heads_packages() -> None:
    done = _run_blocked(
        "import pkgutil, importlib, slurmtel.agent\n"
        "for m in pkgutil.iter_modules(slurmtel.agent.__path__):\n"
        "    importlib.import_module('slurmtel.agent.' + m.name)\n"
        "from slurmtel.agent.main import main\n"
        "raise SystemExit(main(['--help']))\n"
    )
    assert done.returncode == 0, done.stderr
    assert "usage: slurmtel-agent" in done.stdout


def test_slurmtel_without_the_head_says_to_install_it() -> None:
    done = _run_blocked("from slurmtel.head import main\nraise SystemExit(main(['--help']))\n")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "install slurmtel[head]" in done.stderr
    assert "pip install 'slurmtel[head]'" in done.stderr


def test_the_slurmtel_command_is_the_guarded_entry_point() -> None:
    scripts = PYPROJECT["scripts"]
    assert scripts["slurmtel"] == "slurmtel.head:main"
    assert scripts["slurmtel-agent"] == "slurmtel.agent.main:main"
    from slurmtel.head import HEAD_MODULES

    assert set(HEAD_IMPORTS) == HEAD_MODULES


def test_the_install_lines_name_the_extras() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install '.[head]' && slurmtel demo" in readme  # in the activated venv
    assert "pip install '.[nvml]'" in readme  # a GPU node's line of "Install on a cluster"
    assert "pip install 'slurmtel[nvml]'" in (ROOT / "docs" / "daemon.md").read_text()
    assert "-e '.[head,test,nvml]'" in (ROOT / "scripts" / "test").read_text()
