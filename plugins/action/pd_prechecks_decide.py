# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: the prechecks' verdict on the whole play, and what is rolled out, in one controller task.

From every host's pd_host_check result (``plugin_utils.hostcheck.verdict.fleet_verdict``): each host's
verdict, the problems only the play shows (the NPU network across a cluster, a --tags selection that
would leave a cluster half deployed), and either a failure with every problem of every host, once, or
(nothing wrong) the facts ``pd_prechecks_rollout`` and ``pd_prechecks_hccn_ping_targets``. Docker's
warnings are printed as warnings. It replaced a check task per host and the decision task (issue 24).
Documented in plugins/modules/pd_prechecks_decide.py (ansible-doc reads a module's docs there).
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import verdict
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.controller import ControllerAction
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

display = Display()
_VALID = frozenset(("plan", "probes", "play_hosts", "play_hosts_all", "pull_failed", "hccn", "run_tags",
                    "skip_tags", "cluster_batch", "parallel_clusters"))


def decide(plan, probes, play_hosts, play_hosts_all=None, pull_failed=False, hccn=True, run_tags=None,
           skip_tags=None, cluster_batch=None, parallel=False):
    """The task's result: failed with every problem (``msg``, one per line, the Docker warnings after
    them; ``hosts`` those with one) or ok with the facts of the rollout (none when a host left the play or
    an image pull failed), ``warnings_found`` the Docker warnings; ``fleet_problems`` ({host: [lines]}) the
    play's own problems either way. Each host's own problems are in its pd_host_check result (``problems``),
    so they are printed here once, in ``msg`` (the deploy's report reads them there: report.refusal)."""
    found = verdict.fleet_verdict(plan, probes, play_hosts, play_hosts_all, pull_failed, hccn, run_tags,
                                  skip_tags, cluster_batch, parallel)
    result = {"changed": False, "fleet_problems": found["fleet_problems"]}
    if found["problems"]:
        lines = found["problems"] + [f"WARNING {w}" for w in found["warnings"]]
        hosts = [h for h, v in found["verdicts"].items() if v["failed"]]
        result.update(failed=True, msg="\n".join(lines), hosts=hosts)
        return result
    result["warnings_found"] = found["warnings"]
    if found["rollout"] is None:
        why = "an image pull failed" if pull_failed else "a host left the play"
        result["msg"] = f"no rollout decided: {why}"
        return result
    result["msg"] = (f"to roll: {', '.join(found['rollout']['changed']) or 'nothing'}; "
                     f"left as they are: {', '.join(found['rollout']['unchanged']) or 'none'}")
    result["ansible_facts"] = {"pd_prechecks_rollout": found["rollout"],
                               "pd_prechecks_hccn_ping_targets": found["ping_targets"]}
    return result


class ActionModule(ControllerAction):
    """``pd_prechecks_decide: {plan, probes, play_hosts, ...}`` (plugins/modules/pd_prechecks_decide.py)."""

    _VALID_ARGS = _VALID
    PLUGIN = "pd_prechecks_decide"
    REQUIRED = ("plan", "probes", "play_hosts")

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._required_args()
        try:
            flags = {k: boolean(args.get(k, d), strict=True)
                     for k, d in (("pull_failed", False), ("hccn", True), ("parallel_clusters", False))}
        except TypeError as exc:
            raise AnsibleActionFail(f"pd_prechecks_decide: {exc} — pull_failed, hccn and parallel_clusters "
                                    "are booleans") from exc
        try:
            out = decide(args["plan"], args["probes"], args["play_hosts"], args.get("play_hosts_all"),
                         flags["pull_failed"], flags["hccn"], args.get("run_tags"), args.get("skip_tags"),
                         args.get("cluster_batch"), flags["parallel_clusters"])
        except PdError as exc:
            raise AnsibleActionFail(f"pd_prechecks_decide: {exc}") from exc
        if not out.get("failed"):
            for line in out["warnings_found"]:
                display.warning(line)
        result.update(out)
        return result
