#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Documentation of the pd_host_check action plugin (plugins/action/pd_host_check.py): it runs the module
pd_host_probe on the host and judges its result on the controller, so there is no module code here;
ansible-doc reads a module's docs from this file, as for ansible.builtin.debug."""

DOCUMENTATION = r"""
module: pd_host_check
short_description: Read an Ascend host with pd_host_probe and judge what it read, in one task
description:
  - The first task of the pd_prechecks role. Works out pd_host_probe's arguments from the host's entry of
    the fleet plan (its launch specs' devices, paths, images and containers, the NPU network, the
    compatibility readings), runs pd_host_probe on the host, and judges on the controller the host's own
    problems (plugins/plugin_utils/hostcheck - prechecks.problems, compat.problems) and Docker's warnings
    (compat.docker_warnings). A pd_prechecks variable that check_role_options refuses fails the task before
    the probe, each refusal in C(argument_errors).
  - Does not fail on a problem - pd_prechecks_decide does, once for the play, with every host's problems.
    Fails like pd_host_probe when the host cannot be reached or read.
options:
  host_plan:
    description: This host's entry of the fleet plan, C(hostvars['localhost'].pd_plan_fleet.hosts[inventory_hostname]).
    type: dict
    required: true
  vllm_ascend_version:
    description: The vllm-ascend version row of the host's cluster (the image's build records and the driver are judged against it).
    type: str
  docker_socket:
    description: Docker Engine API socket on the host.
    type: path
    required: true
  ascend_root:
    description: Prefix of the host's Ascend paths (devices, driver, npu-smi, hccn_tool, /etc/hccn.conf); empty on a real host.
    type: str
    default: ""
  skip:
    description: C(pd_prechecks_skip) - read and judge only Docker, the containers and their health.
    type: bool
    default: false
  hccn:
    description: Read the NPU network with hccn_tool (off with O(skip)).
    type: bool
    default: true
  compat:
    description: Read the image build records, the driver's version.info and Docker's daemon.json (off with O(skip)).
    type: bool
    default: true
  docker_daemon_json:
    description: Docker's daemon configuration file on the host.
    type: path
    default: /etc/docker/daemon.json
  min_free_disk:
    description: Free space wanted on the filesystem of the model directory (a size, e.g. C(10GiB)).
    type: raw
    default: 10GiB
  probe_timeout:
    description: Seconds a container running its current launch spec may take to answer its health URL.
    type: int
    default: 15
  probe_interval:
    description: Seconds between two health probes.
    type: int
    default: 3
  check_role_options:
    description:
      - An entry point of the task's role (e.g. C(main)) - first check the role's variables against its
        meta/argument_specs.yml, with the validator and message of the argument check Ansible prepends to a
        role (C(argument_errors) lists them), so that the role can be included with C(rolespec_validate=false)
        and spare that task. Empty - no check.
    type: str
    default: ""
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: It only reads, in check mode too.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the host in one probe and judge it
  become: true
  pd.deploy.pd_host_check:
    host_plan: "{{ hostvars['localhost'].pd_plan_fleet.hosts[inventory_hostname] }}"
    docker_socket: /var/run/docker.sock
  register: probe
"""

RETURN = r"""
argument_errors:
  description: With O(check_role_options), each variable of the role that its argument spec refuses (the task then fails before the probe).
  type: list
  elements: str
  returned: when a variable was refused
problems:
  description: This host's own problems, each C(host - what - what to do); empty when it has none.
  type: list
  elements: str
  returned: when the host was read
docker_warnings:
  description: Docker's log rotation and memlock findings on this host (warnings, not problems).
  type: list
  elements: str
  returned: when the host was read
containers:
  description: What pd_host_probe returns (the pd-deploy containers, their health, the readings judged).
  type: list
  elements: dict
  returned: when the host was read
"""
