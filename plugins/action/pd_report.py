# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: show the deploy's closing report as lines and hand it to set_stats, in one task.

The report play printed it with debug; an AWX / Automation Platform job keeps nothing of a run but its
stdout and the custom stats of ``set_stats``, and the build directory is lost with the job's pod. This
prints the report as plain text, one output line per report line under the task's banner (never one
JSON-escaped string, whatever the callback's result format), and returns the lines as ``msg`` and as
``ansible_stats`` (what set_stats returns: global, not per host), so the job's artifacts hold the report
under ``stats_key``. The result itself is shown only with -v: printed as well, the stats would repeat
the report (a set_stats task prints them the same way), and a second task (debug, then set_stats) costs
every run a task.

Documented in plugins/modules/pd_report.py (ansible-doc reads a module's docs there).
"""

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.pd.deploy.plugins.plugin_utils.shared.controller import ControllerAction

display = Display()

_VALID = frozenset(("lines", "data", "stats_key"))


def report_result(lines, data=None, stats_key="pd_deploy_report"):
    """The task's result: ``msg`` the report's lines, ``ansible_stats`` {data: {stats_key: data + lines}}."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    if not isinstance(lines, (list, tuple)):
        raise AnsibleActionFail(f"pd_report: lines: expected a list of lines, got {type(lines).__name__} — pass the "
                                "pd_rollout_summary lines")
    if data is not None and not isinstance(data, dict):
        raise AnsibleActionFail(f"pd_report: data: expected a mapping, got {type(data).__name__}")
    if not isinstance(stats_key, str) or not stats_key.isidentifier():
        raise AnsibleActionFail(f"pd_report: stats_key: {stats_key!r} is not a variable name")
    text = [str(line) for line in lines]
    body = dict(data or {}, lines=text)
    return {"changed": False, "msg": text,
            "ansible_stats": {"data": {stats_key: body}, "per_host": False, "aggregate": False}}


class ActionModule(ControllerAction):
    """``pd_report: {lines: [...], data: {...}, stats_key: pd_deploy_report}`` — on the controller."""

    _VALID_ARGS = _VALID
    PLUGIN = "pd_report"
    REQUIRED = ("lines",)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._required_args()
        result.update(report_result(args["lines"], args.get("data"), args.get("stats_key", "pd_deploy_report")))
        # the text as it reads, through the controller's display (a worker's display goes to the main process)
        display.display("\n".join(result["msg"]))
        return result
