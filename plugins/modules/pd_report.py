#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_report action plugin (plugins/action/pd_report.py): it runs on the controller
only, so there is no module code here; ansible-doc reads a module's docs from this file, as for
ansible.builtin.debug."""

DOCUMENTATION = r"""
module: pd_report
short_description: Show a report as lines and keep it in the run's custom stats (AWX job artifacts)
description:
  - Prints O(lines) as plain text under the task's banner (one output line per report line, whatever the
    callback's result format) and returns them, with O(data), as custom stats like M(ansible.builtin.set_stats)
    (global, not per host, replacing any earlier value of O(stats_key)). AWX / Automation Platform keeps a job's
    custom stats as its artifacts, so the report outlives the job's pod and its build directory.
  - The task's result (C(msg) and C(ansible_stats)) is shown with -v only, as a set_stats task's is.
  - Runs on the controller only (an action plugin; no module is sent to a host).
options:
  lines:
    description: The report, one line each (a text is split into lines).
    type: raw
    required: true
  data:
    description: More keys kept beside C(lines) in the stats (the outcome, the inventory).
    type: dict
    default: {}
  stats_key:
    description: Name of the custom stat.
    type: str
    default: pd_deploy_report
attributes:
  check_mode:
    support: full
    description: Prints and records the report in check mode too; it changes nothing on any host.
  diff_mode:
    support: none
    description: Returns no diff (the report is output, not a change).
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Show the closing report and keep it as the job's artifact
  pd.deploy.pd_report:
    lines: "{{ hostvars['localhost'].pd_plan_fleet | pd.deploy.pd_rollout_summary(ansible_play_hosts_all) }}"
    data: {outcome: rendered}
  run_once: true
"""

RETURN = r"""
msg:
  description: The report's lines.
  type: list
  elements: str
  returned: always
ansible_stats:
  description: The custom stats set - C(data) ({stats_key -> data with C(lines)}), C(per_host) false, C(aggregate) false.
  type: dict
  returned: always
"""
