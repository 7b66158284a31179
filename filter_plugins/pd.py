"""Ansible filters of pd-deploy.

The logic lives in the ``pd_deploy`` package (pure functions, unit tested directly); this file only
maps filter names to those functions, plus one adapter that turns Ansible's lazy ``hostvars`` into
the plain dicts the core expects.
"""

import os
import sys

# pd_deploy is imported from the checkout this plugin belongs to (kolla-ansible installs its
# filters' package with pip; here the repository is the package, so no install step is needed).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from pd_deploy import (  # noqa: E402
    capacity, connectors, containers, fleet, logparse, ops, prechecks, report, rules, sizes, versions)
from pd_deploy.fleet import HOST_VARS  # noqa: E402

_READ = ("pd_cluster", "ansible_host") + HOST_VARS


def fleet_input(hostvars, host_names, limit=None):
    """Plain fleet description from ``hostvars`` for ``host_names`` (inventory order).

    Only the pd_* keys the model reads are templated, so a large inventory stays cheap.
    """
    hosts = []
    for name in host_names:
        hv = hostvars[name]
        data = {key: hv[key] for key in _READ if key in hv}
        hosts.append({"name": name, "groups": list(hv.get("group_names", [])), "vars": data})
    return {"hosts": hosts, "limit": list(limit) if limit else None}


def plan_from_hostvars(hostvars, host_names, limit=None):
    """``pd_fleet_plan`` straight from Ansible's hostvars: fleet_input() then fleet.plan_fleet()."""
    return fleet.plan_fleet(fleet_input(hostvars, host_names, limit))


class FilterModule:
    """Maps filter names to the core's functions."""

    def filters(self):
        out = {}
        for module in (sizes, capacity, logparse, versions, connectors, rules, fleet, containers, report,
                       prechecks, ops):
            out.update(module.FILTERS)
        out["pd_fleet_input"] = fleet_input
        out["pd_plan_from_hostvars"] = plan_from_hostvars
        return out
