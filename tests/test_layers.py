"""The walls between slurmtel's layers, checked from the source: every module is parsed with
`ast` and every import it makes, at the top level and inside functions, is collected with
relative names resolved.

- parsers import no database code (sqlalchemy, psycopg, slurmtel.store);
- the node agent (slurmtel.agent) imports no store and no database driver, nor does
  slurmtel.auth (identity for every HTTP server, the agent's included);
- the store imports no reports, commands, CLI, parsers or the modules that shape its rows
  (chargeback, budget, cost): it returns rows (slurmtel.rows), callers shape them; the SQL of
  advisory locks and of a Scope is the store's (store/locks.py; the scope test is the database function slurmtel_in_scope);
- the pages (slurmtel.pages) import no database code and hold no SQL: they render the
  documents the read API computes (slurmtel.api.app.ReadApi), no second query path;
- slurmtel.records and slurmtel.jobrows import nothing of slurmtel, slurmtel.rows nothing but
  slurmtel.errors and slurmtel.jobrows (whose rows it re-exports);
- no two slurmtel modules import each other, directly or through a longer cycle.

A breach fails naming the module and the import."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "slurmtel"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = all_modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, source: str, is_package: bool = False) -> Iterator[tuple[str, int]]:
    """Every module `name` imports, anywhere in its body (in functions too), as an absolute
    dotted name with the line. `from pkg import x` yields `pkg.x` when that is a module of
    slurmtel, else `pkg`. Imports under `if TYPE_CHECKING:` are left out: they never run (the
    type checker reads them, the interpreter does not)."""
    tree = ast.parse(source)
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                # a package's __init__ is the package itself: level 1 is the package
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno


IMPORTS: dict[str, list[tuple[str, int]]] = {
    name: list(imports_of(name, path.read_text(), path.name == "__init__.py"))
    for name, path in MODULES.items()
}


def _within(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def breaches(modules: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    found = [
        f"{name} imports {target} ({MODULES[name].relative_to(ROOT)}:{line})"
        for name, found in IMPORTS.items()
        if _within(name, modules)
        for target, line in found
        if _within(target, forbidden)
    ]
    return list(dict.fromkeys(found))


DATABASE = ("sqlalchemy", "psycopg", "psycopg2", "alembic", "pgserver", "slurmtel.store")


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        pytest.param(("slurmtel.parsers",), DATABASE, id="parsers-no-database"),
        pytest.param(("slurmtel.agent",), DATABASE, id="agent-no-store-no-driver"),
        pytest.param(("slurmtel.auth",), DATABASE, id="auth-no-database"),
        pytest.param(("slurmtel.pages",), DATABASE, id="pages-no-database"),
        pytest.param(
            ("slurmtel.chargeback.model", "slurmtel.chargeback.pricing", "slurmtel.chargeback.render"),
            DATABASE,
            id="chargeback-money-is-pure",
        ),
        pytest.param(
            ("slurmtel.store",),
            (
                "slurmtel.reports",
                "slurmtel.commands",
                "slurmtel.cli",
                "slurmtel.chargeback",
                "slurmtel.budget",
                "slurmtel.cost",
                "slurmtel.demo",
                "slurmtel.scheduler",
                "slurmtel.__main__",
                # gc_paused, which the store shares with the parsers, is in slurmtel.gcpause
                "slurmtel.parsers",
            ),
            id="store-no-reports-commands-cli-api",
        ),
    ],
)
def test_layer_wall(modules: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    found = breaches(modules, forbidden)
    assert found == [], "imports across a wall:\n" + "\n".join(found)


def test_records_import_nothing_of_slurmtel() -> None:
    found = breaches(("slurmtel.records",), ("slurmtel",))
    assert found == [], "\n".join(found)


def test_rows_import_nothing_of_slurmtel_but_its_errors() -> None:
    found = [
        f
        for f in breaches(("slurmtel.rows",), ("slurmtel",))
        if " slurmtel.errors " not in f and " slurmtel.jobrows " not in f
    ]
    assert found == [], "\n".join(found)


def test_job_rows_import_nothing_of_slurmtel() -> None:
    found = breaches(("slurmtel.jobrows",), ("slurmtel",))
    assert found == [], "\n".join(found)


def test_locks_and_scope_sql_live_in_the_store() -> None:
    """The advisory-lock SQL and the scope test are SQL: only slurmtel/store writes them."""
    found = [
        f"{path.relative_to(ROOT)}: {needle}"
        for name, path in MODULES.items()
        if not _within(name, ("slurmtel.store",))
        for needle in ("pg_advisory", "slurmtel_in_scope(", "scope_accounts AS text[]")
        if needle in path.read_text()
    ]
    assert found == [], "SQL outside slurmtel/store:\n" + "\n".join(found)


def test_pages_hold_no_sql() -> None:
    """The pages and their templates write no query: what they show comes from the API's
    documents (a page that queried for itself would be a second path around its scope)."""
    sql = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b[^\n]*\b(FROM|INTO|SET|WHERE)\b")
    files = [*(PACKAGE / "pages").rglob("*.py"), *(PACKAGE / "pages").rglob("*.html")]
    assert files, "slurmtel/pages exists"
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}" for path in files for m in sql.finditer(path.read_text())
    ]
    assert found == [], "SQL in the pages:\n" + "\n".join(found)


def test_no_sql_text_is_imported_across_modules() -> None:
    """SQL that several queries share is a database function or view (migrations), not a
    string one module exports and another pastes into its query: no module imports a name
    ending in _SQL (or _CTES) from another."""
    found = [
        f"{name}: from {node.module} import {alias.name}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slurmtel")
        for alias in node.names
        if alias.name.endswith(("_SQL", "_CTES"))
    ]
    assert found == [], "SQL text imported across modules:\n" + "\n".join(found)


def _graph() -> dict[str, set[str]]:
    """Module -> the slurmtel modules it imports. Importing `pkg.mod` also runs `pkg`'s
    __init__, but that is no edge of the importer's making: only the named module counts."""
    graph: dict[str, set[str]] = {}
    for name, found in IMPORTS.items():
        graph[name] = {t for t, _ in found if t in MODULES and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles() -> None:
    graph = _graph()
    found = []
    for component in _cycles(graph):
        members = set(component)
        edges = [
            f"{a} imports {b} (line {line})"
            for a in component
            for b, line in IMPORTS[a]
            if b in members and b != a
        ]
        found.append(" <-> ".join(component) + ":\n  " + "\n  ".join(edges))
    assert found == [], "import cycles between slurmtel modules:\n" + "\n".join(found)


def test_the_checker_sees_in_function_and_relative_imports() -> None:
    source = (
        "from . import sacct_json\n"
        "from ..store import engine\n"
        "from .. import records\n"
        "def f():\n"
        "    import sqlalchemy\n"
        "    from slurmtel.store.jobs import x\n"
        "if TYPE_CHECKING:\n"
        "    from slurmtel.cli import main\n"
    )
    found = {t for t, _ in imports_of("slurmtel.parsers.probe", source)}
    assert found == {
        "slurmtel.parsers.sacct_json",
        "slurmtel.store.engine",
        "slurmtel.records",
        "sqlalchemy",
        "slurmtel.store.jobs",
    }
    in_package = {t for t, _ in imports_of("slurmtel.store", "from . import jobs\n", is_package=True)}
    assert in_package == {"slurmtel.store.jobs"}


def test_windows_are_read_and_written_only_through_the_sample_store() -> None:
    """Attribution, the job view and the reports read windows through slurmtel_gpu_windows()
    and the sources write them through slurmtel.store.samples: no other module names the
    tables that hold them (so another sample store does not touch them)."""
    tables = re.compile(
        r"\b(FROM|JOIN|INTO|UPDATE)\s+(gpu_summary|gpu_window|gpu_window_hour)\b", re.IGNORECASE
    )
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for name, path in MODULES.items()
        if name not in ("slurmtel.store.telemetry", "slurmtel.store.samples")
        for match in tables.finditer(path.read_text())
    ]
    assert found == [], "windows read or written outside the sample store:\n" + "\n".join(found)
    writers = [
        name
        for name, path in MODULES.items()
        if name not in ("slurmtel.store.telemetry", "slurmtel.store.samples")
        and re.search(r"\bwrite_summaries\(", path.read_text())
    ]
    assert writers == []
