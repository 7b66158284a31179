#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_write_files action plugin (plugins/action/pd_write_files.py).

The action runs entirely on the controller and never transfers a module, so this file holds only the
page that ``ansible-doc`` shows, the way ansible-core documents its own action-only plugins.
"""

DOCUMENTATION = r"""
module: pd_write_files
short_description: Write many small files on the controller in one task, and only those that changed
description:
  - Runs on the controller (an action plugin; nothing is sent to the host the task targets).
  - Writes each entry of O(files) whose content differs from what the file holds now (same content, no
    write), through a temporary file renamed into place.
  - With O(root) the directory holds exactly the files of the last run; a manifest
    (C(<root>/.pd-deploy-files.json)) lists what this action wrote there and for which O(owner); a file of
    the previous manifest that this run does not write is removed, and so are the folders that removal left
    empty. Files this action did not write are never touched.
  - When the previous manifest names another O(owner), the files are replaced and a warning says so
    (C(-e pd_plan_build_dir=<dir>) keeps both inventories' output).
options:
  files:
    description: The files to write, each a mapping with C(path) and C(content) (both strings).
    type: list
    elements: dict
    required: true
  mode:
    description: Octal permission bits of the files written (as a string).
    type: str
    default: "0644"
  root:
    description: Directory whose contents this action owns; every path of O(files) must be under it. Unset, the
      files are written and nothing is removed.
    type: path
  owner:
    description: Who the files under O(root) belong to (pd-deploy passes the inventory's name).
    type: str
notes:
  - It writes under C(--check) too (the files are review output on the controller, not host state); pd-deploy's
    tasks say so with C(check_mode=false) and run it once, delegated to C(localhost).
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the launch specs of a render-only run
  pd.deploy.pd_write_files:
    root: "{{ pd_plan_build_dir }}"
    owner: "{{ ansible_inventory_sources | join(', ') }}"
    files:
      - path: "{{ pd_plan_build_dir }}/plan.json"
        content: "{{ plan | to_nice_json }}"
  run_once: true
  delegate_to: localhost
  check_mode: false
"""

RETURN = r"""
written:
  description: Paths whose content changed (written by this run).
  type: list
  elements: str
  returned: always
removed:
  description: Paths of the previous manifest under O(root) that this run did not write, removed.
  type: list
  elements: str
  returned: always
files:
  description: How many files were asked for.
  type: int
  returned: always
"""
