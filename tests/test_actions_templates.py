"""The message templates against the declared figures (slurmtel.actions.figures): every figure a
shipped template shows is declared, with a unit in its name, and listed for that template;
site templates replace shipped ones; a broken site template fails loudly, not silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from sqlalchemy import Engine, text

from slurmtel.actions.cycle import run_cycle
from slurmtel.actions.figures import FIGURES, TEMPLATE_FIGURES
from slurmtel.actions.render import SHIPPED, one_line
from slurmtel.columns import column
from slurmtel.config import config_from_dict
from tests.factories import T0, windows
from tests.test_actions_rules import after, load, no_coordinators, running_job

# the variables through which a template reaches figures (a GPU row, a statement line), and
# what of a GPU row names it rather than measures it
FIGURE_HOLDERS = {"figures", "gpu"}
IDENTITY = {"gpu", "gpu_uuid", "node"}

ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(str(SHIPPED)))


def figures_used(name: str) -> set[str]:
    """Every `figures.X`, `gpu.X` and `line.figures.X` in template NAME and what it includes."""
    tree = ENV.parse(ENV.loader.get_source(ENV, name)[0])  # type: ignore[union-attr]
    used: set[str] = set()
    for node in tree.find_all(nodes.Getattr):
        target = node.node
        if isinstance(target, nodes.Name) and target.name in FIGURE_HOLDERS and node.attr not in IDENTITY:
            used.add(node.attr)
        if isinstance(target, nodes.Getattr) and target.attr == "figures":
            used.add(node.attr)
    for include in tree.find_all(nodes.Include):
        if isinstance(include.template, nodes.Const):
            used |= figures_used(include.template.value)
    return used


def test_every_template_shows_only_declared_figures() -> None:
    names = {p.stem for p in SHIPPED.iterdir() if not p.name.startswith("_")}
    assert names == set(TEMPLATE_FIGURES), "a template without a declaration, or a declaration without one"
    for name in names:
        for form in ("txt", "html"):
            used = figures_used(f"{name}.{form}")
            assert used, f"{name}.{form} shows no figure"
            assert used <= set(TEMPLATE_FIGURES[name]), f"{name}.{form}: {used - set(TEMPLATE_FIGURES[name])}"
    for listed in TEMPLATE_FIGURES.values():
        assert set(listed) <= set(FIGURES)


def test_every_figure_is_a_registered_column_with_a_source() -> None:
    """One vocabulary (issue 22): a figure a message shows is a column of slurmtel.columns, with
    its unit in its name and its meaning there."""
    for figure in FIGURES.values():
        # the registry keeps the unit rule: a kind's suffix (_seconds, _bytes, _share, ...)
        column(figure.name)
        assert figure.column and figure.source, figure.name
        if figure.name.endswith("_share") and figure.column.endswith("_percent"):
            assert figure.scale == 0.01, figure.name


def test_subjects_are_one_line() -> None:
    assert one_line("a\r\nBcc: x@y\r\n\tz\x1b") == "a Bcc: x@y z"
    assert len(one_line("x" * 500)) == 200


def test_a_site_template_replaces_the_shipped_one(engine: Engine, tmp_path: Path) -> None:
    site = tmp_path / "templates"
    site.mkdir()
    (site / "gpus_idle-warning.txt").write_text(
        "Subject: GPUs of {{ job.job_id }} idle\n\n{{ figures.matched_gpus }} idle GPU(s), {{ job.name }}\n"
    )
    load(engine, running_job(gpus=1, name="<b>"), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    config = config_from_dict(
        {"actions": {"templates_dir": str(site), "recipients": {"domain": "example.org"}}}
    )
    report = run_cycle(engine, config, now=after(70), dry_run=True, recipients=no_coordinators(config))
    message = report.rendered[0]
    assert message.title == "GPUs of 7 idle"
    assert message.text == "1 idle GPU(s), <b>\n"
    # the HTML form is still the shipped one, escaped
    assert "&lt;b&gt;" in message.html


def test_a_broken_site_template_is_an_error_and_nothing_is_sent(engine: Engine, tmp_path: Path) -> None:
    site = tmp_path / "templates"
    site.mkdir()
    (site / "gpus_idle-warning.txt").write_text("Subject: {{ figures.no_such_figure }}\n\nx\n")
    load(engine, running_job(gpus=1), windows("GPU-a1", T0, 140, job="7"), [1], after(70))
    config = config_from_dict(
        {"actions": {"templates_dir": str(site), "recipients": {"domain": "example.org"}}}
    )
    report: Any = run_cycle(engine, config, now=after(70), dry_run=True, recipients=no_coordinators(config))
    assert report.rendered == {}
    assert report.errors and "no_such_figure" in report.errors[0]
    report = run_cycle(engine, config, now=after(70), recipients=no_coordinators(config), deliver=False)
    assert report.recorded == 0 and "template gpus_idle-warning" in report.errors[0]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM action_log")).scalar_one() == 0
