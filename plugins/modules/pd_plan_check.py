#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_plan_check action plugin (plugins/action/pd_plan_check.py): it runs on the
controller only, so there is no module code here; ansible-doc reads a module's docs from this file, as
for ansible.builtin.debug."""

DOCUMENTATION = r"""
module: pd_plan_check
short_description: Judge a fleet plan, write its files and show its capacity summary, in one controller task
description:
  - The second task of the pd_plan role, after the plan is computed (C(pd_plan_fleet)). Runs on the
    controller only (an action plugin; no module is sent to a host).
  - In this order, each step only when the one before passed - refuse an inventory that cannot be
    planned (no host in pd_clusters; the embedded demo inventory with O(refuse_demo)); fail with the
    counts of the plan's violations (C(msg)) and every violation, once (C(violations)), writing
    nothing; else write plan.json, the capacity summaries and (O(render_specs)) one launch spec per
    container under O(build_dir), with the code of the pd_write_files action (its manifest, the removal of the last run's files that this run
    does not write, its warning when the directory held another inventory's output).
  - The result is shown like debug's - the inventory checked (C(inventory)), the capacity summary
    (C(msg)) and the warnings, if any (C(violations)).
options:
  plan:
    description: The fleet plan, C(hostvars['localhost'].pd_plan_fleet) (pd_plan_from_hostvars).
    type: dict
    required: true
  inventory:
    description: The inventory sources, C(ansible_inventory_sources) (named in the messages, and the owner
      recorded in O(build_dir)'s manifest).
    type: list
    elements: str
    required: true
  cluster_hosts:
    description: Number of hosts in the clusters group (0 is refused).
    type: int
    required: true
  demo:
    description: The inventory is the embedded demo inventory (its first cluster host sets C(pd_inventory_render_only)).
    type: bool
    default: false
  refuse_demo:
    description: Refuse the demo inventory (the run would start containers; pd_plan_refuse_demo).
    type: bool
    default: false
  build_dir:
    description: Controller directory of the files (pd_plan_build_dir); empty writes nothing.
    type: path
    default: ""
  render_specs:
    description: Also write one JSON launch spec per container to <build_dir>/render/<host>/.
    type: bool
    default: false
  cluster_batch:
    description:
      - The rollout's batch size (deploy-pd.yml's C(pd_cluster_batch)), refused when it is not a number or
        share of clusters - after the plan's checks, before anything is written; null when not given.
    type: raw
  parallel_clusters:
    description: C(pd_parallel_clusters), which a batch size contradicts.
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: Under --check nothing is written; the result lists the files that would change (C(would_write),
      C(would_remove)) and says so (C(check_mode)).
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stop before touching any host when the fleet breaks a rule, else write and show the plan's summaries
  pd.deploy.pd_plan_check:
    plan: "{{ hostvars['localhost'].pd_plan_fleet }}"
    inventory: "{{ ansible_inventory_sources }}"
    cluster_hosts: "{{ groups['pd_clusters'] | default([]) | length }}"
    build_dir: "{{ pd_plan_build_dir }}"
  run_once: true
"""

RETURN = r"""
inventory:
  description: Which inventory was checked, and how many cluster hosts it holds (says when it is the demo inventory).
  type: str
  returned: unless the inventory was refused
  sample: Checking the inventory /etc/pd/prod (4 cluster host(s)).
msg:
  description: On success the capacity summary of every cluster, as lines; on failure why (the counts
    of the violations, listed in C(violations)).
  type: raw
  returned: always
violations:
  description: Every violation of the plan (errors on failure, else warnings), under their counts, as one
    block of text (each violation on one line, printed once).
  type: str
  returned: when the plan has a violation
written:
  description: Number of files whose content this run changed under build_dir.
  type: int
  returned: success
removed:
  description: Files of the previous run that this run did not write, removed.
  type: list
  elements: str
  returned: success
would_write:
  description: Under --check, the files whose content would change (nothing is written).
  type: list
  elements: str
  returned: success in check mode
would_remove:
  description: Under --check, the previous run's files that would be removed.
  type: list
  elements: str
  returned: success in check mode
check_mode:
  description: Under --check, that nothing was written and how many files would change.
  type: str
  returned: success in check mode
"""
