#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_plan_make action plugin (plugins/action/pd_plan_make.py): it runs on the
controller only, so there is no module code here; ansible-doc reads a module's docs from this file, as
for ansible.builtin.debug."""

DOCUMENTATION = r"""
module: pd_plan_make
short_description: Check the pd_plan role's variables and make the fleet plan, in one controller task
description:
  - The first task of the pd_plan role. Runs on the controller only (an action plugin; no module is sent to a host).
  - Checks the variables of the task's role against its C(meta/argument_specs.yml), entry point O(check_role_options),
    with Ansible's own validator and message, so that the role is included with C(rolespec_validate=false) and
    needs no argument-check task of its own; a refused variable fails the task, before any plan.
  - Then returns, as facts (the role runs it with C(delegate_facts) on localhost), C(pd_plan_fleet) (O(plan)),
    C(pd_plan_build_dir) (the role's, resolved) and C(pd_plan_problem) (with C(pd_plan_report_failure), why the run
    is refused whatever the fleet's rules say, the text pd_plan_check fails with; else an empty string).
options:
  check_role_options:
    description: The entry point of the task's role whose options are checked (C(main)).
    type: str
    required: true
  plan:
    description: The fleet plan (filter pd_plan_from_hostvars of the clusters group's hosts, the play's among them
      as the limit), published as C(pd_plan_fleet).
    type: dict
    required: true
  inventory:
    description: The inventory sources, C(ansible_inventory_sources).
    type: list
    elements: str
    required: true
  cluster_hosts:
    description: Number of hosts in the clusters group.
    type: int
    required: true
  demo:
    description: The inventory is the embedded demo inventory (its first cluster host sets C(pd_inventory_render_only)).
    type: bool
    default: false
  parallel_clusters:
    description: C(pd_parallel_clusters), which a rollout batch size contradicts.
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: It changes nothing; under --check it makes the same plan.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Plan and check the whole fleet
  pd.deploy.pd_plan_make:
    check_role_options: main
    plan: "{{ hostvars | pd.deploy.pd_plan_from_hostvars(groups['pd_clusters']) }}"
    inventory: "{{ ansible_inventory_sources }}"
    cluster_hosts: "{{ groups['pd_clusters'] | length }}"
  run_once: true
  delegate_to: localhost
  delegate_facts: true
"""

RETURN = r"""
ansible_facts:
  description: C(pd_plan_fleet), C(pd_plan_build_dir) and C(pd_plan_problem).
  type: dict
  returned: success
argument_errors:
  description: Each variable of the role that its argument spec refuses (the task then fails).
  type: list
  elements: str
  returned: failure on a refused variable
"""
