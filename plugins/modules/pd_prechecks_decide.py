#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_prechecks_decide action plugin (plugins/action/pd_prechecks_decide.py): it runs
on the controller only, so there is no module code here; ansible-doc reads a module's docs from this file,
as for ansible.builtin.debug."""

DOCUMENTATION = r"""
module: pd_prechecks_decide
short_description: Judge the prechecks of the whole play and decide what is rolled out, in one controller task
description:
  - The second task of the pd_prechecks role, once for the play (run_once, on the controller), after
    pd_host_check has read and judged every host. Runs on the controller only (an action plugin; no module
    is sent to a host).
  - Fails with every problem of every host, each line naming its host, and the problems only the play shows
    (the NPU network across a cluster, netchecks.cluster_problems; a --tags / --skip-tags selection
    that would leave a cluster half deployed, selection.tag_problems; both in plugins/plugin_utils), Docker's
    warnings after them.
  - Else prints Docker's warnings as warnings and, unless a host left the play or an image pull failed, sets
    the facts C(pd_prechecks_rollout) (order.rollout_targets) and C(pd_prechecks_hccn_ping_targets)
    (netchecks.ping_targets of the rolled clusters' hosts); with C(delegate_facts) they go to the delegated host.
options:
  plan:
    description: The fleet plan, C(hostvars['localhost'].pd_plan_fleet).
    type: dict
    required: true
  probes:
    description: Every play host's pd_host_check result, C({host - result}).
    type: dict
    required: true
  play_hosts:
    description: The play's hosts (C(ansible_play_hosts)); the first one carries the play's own problems.
    type: list
    elements: str
    required: true
  play_hosts_all:
    description: Every host the play started with (C(ansible_play_hosts_all)); one that left it means no rollout.
    type: list
    elements: str
  pull_failed:
    description: An image pull of the run failed on a play host (no rollout).
    type: bool
    default: false
  hccn:
    description: Judge the NPU network across each cluster and work out the NPU ping targets.
    type: bool
    default: true
  run_tags:
    description: C(ansible_run_tags).
    type: list
    elements: str
  skip_tags:
    description: C(ansible_skip_tags).
    type: list
    elements: str
  cluster_batch:
    description: The rollout's batch size (C(pd_cluster_batch)), clusters or a share of them; null for one at a time.
    type: raw
  parallel_clusters:
    description: Roll every changed cluster at once (C(pd_parallel_clusters)).
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: It changes nothing; under --check it decides the same way.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fail with every problem found on the hosts, else decide which clusters are rolled out
  pd.deploy.pd_prechecks_decide:
    plan: "{{ hostvars['localhost'].pd_plan_fleet }}"
    probes: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'probe'))) }}"
    play_hosts: "{{ ansible_play_hosts }}"
  run_once: true
  delegate_to: localhost
  delegate_facts: true
"""

RETURN = r"""
fleet_problems:
  description:
    - The problems only the play shows (NPU network across a cluster, a half-deploying --tags), C({host - [lines]}),
      given to the play's first host; empty when there are none. Each host's own problems are in its pd_host_check
      result (C(problems)).
  type: dict
  returned: always
msg:
  description: Every problem, one per line, then Docker's warnings; or what is rolled and what is left as it is.
  type: str
  returned: always
hosts:
  description: The hosts with a problem.
  type: list
  elements: str
  returned: failure
ansible_facts:
  description: C(pd_prechecks_rollout) and C(pd_prechecks_hccn_ping_targets), when a rollout is decided.
  type: dict
  returned: success
"""
