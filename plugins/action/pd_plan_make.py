# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: check pd_plan's variables and make the fleet plan, on the controller, in one task.

pd_plan's first two tasks were Ansible's argument check of the role (a task prepended to every include, a
worker process on every run, the no-op re-run's too; issue 24) and a set_fact that made the plan. This
checks the role's variables against its meta/argument_specs.yml with Ansible's own validator and message
(``check_role_options``), then publishes the same facts the set_fact did, from the checked values:

- ``pd_plan_fleet``: the fleet plan (argument ``plan``: filter pd_plan_from_hostvars in the task's templating,
  of the hosts of the clusters group with the play's among them as the ``--limit``);
- ``pd_plan_build_dir``: the build directory, resolved;
- ``pd_plan_problem``: with ``pd_plan_report_failure``, why the run is refused whatever the fleet's rules say
  (``summary.plan_problem``, the text pd_plan_check fails with; '' when it is not), else ''.

The facts are only published when the variables pass: a refused variable fails the task before any plan.
Documented in plugins/modules/pd_plan_make.py (ansible-doc reads a module's docs there).
"""

import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.controller import ControllerAction, role_options
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError


def facts(values, plan, inventory, cluster_hosts, demo=False, parallel_clusters=False):
    """The plan's facts from pd_plan's checked variables ``values``: the plan made by the task's arguments
    (filter pd_plan_from_hostvars, in the task's templating: an inventory's broken or vaulted variable is
    reported as the filter reports it), the build directory resolved, the run's problem."""
    problem = ""
    if values["pd_plan_report_failure"]:
        problem = report.plan_problem(inventory, cluster_hosts, demo, values["pd_plan_refuse_demo"],
                                      values["pd_plan_cluster_batch"], parallel_clusters)
    return {"pd_plan_fleet": plan, "pd_plan_build_dir": os.path.realpath(values["pd_plan_build_dir"]),
            "pd_plan_problem": problem}


class ActionModule(ControllerAction):
    """``pd_plan_make: {check_role_options, plan, inventory, cluster_hosts, demo, parallel_clusters}``
    (plugins/modules/pd_plan_make.py)."""

    _VALID_ARGS = frozenset(("check_role_options", "plan", "inventory", "cluster_hosts", "demo", "parallel_clusters"))
    PLUGIN = "pd_plan_make"
    REQUIRED = ("check_role_options", "plan", "inventory", "cluster_hosts")

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._required_args()
        errors, values = role_options(self, self.PLUGIN, str(args["check_role_options"]), task_vars)
        if errors:
            result.update(failed=True, argument_errors=errors, msg="Validation of arguments failed:\n" + "\n".join(errors))
            return result
        inventory = args["inventory"]
        try:
            hosts = int(args["cluster_hosts"])
            flags = {k: boolean(args.get(k, False), strict=True) for k in ("demo", "parallel_clusters")}
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"pd_plan_make: {exc} — cluster_hosts is a number, demo and parallel_clusters "
                                    "(pd_parallel_clusters) are booleans") from exc
        try:
            made = facts(values, args["plan"], [inventory] if isinstance(inventory, str) else list(inventory or []),
                         hosts, flags["demo"], flags["parallel_clusters"])
        except PdError as exc:
            raise AnsibleActionFail(f"pd_plan_make: {exc}") from exc
        result.update(changed=False, ansible_facts=made)
        return result
