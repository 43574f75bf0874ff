"""Every view that is not a report spec, by its API name (`/v1/reports/NAME`): the read API
serves them beside the specs of slurmtel.reports.catalog, with the same access rules."""

from __future__ import annotations

from slurmtel.commands import budget, cost, fabric, idle_now
from slurmtel.commands.views import View

VIEWS: dict[str, View] = {
    view.name: view
    for view in (cost.VIEW, budget.VIEW, fabric.VIEW, fabric.NODES_VIEW, fabric.DRIFT_VIEW, idle_now.VIEW)
}
