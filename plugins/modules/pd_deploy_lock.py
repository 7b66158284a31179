#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A cluster's deploy lock: one JSON file on one host of the cluster, taken and given back atomically."""

DOCUMENTATION = r"""
module: pd_deploy_lock
short_description: Take, check or give back a cluster's deploy lock on one of its hosts
description:
  - The lock is the file C(<dir>/<cluster>.lock) on the host the task runs on (deploy-pd.yml uses the
    cluster's first host), created with O_EXCL so that two runs cannot both take it.
  - Its content names the holder (controller, user, process id and start time, run id, start time of
    the run). Use it through the action plugin of the same name, which fills in the holder and decides
    whether a lock held by another run is live or stale; the module itself never breaks a lock unless
    C(force) is set.
options:
  cluster:
    description: Cluster name (the lock file's name).
    type: str
    required: true
  dir:
    description: Directory of the lock files on the host.
    type: path
    default: /var/lib/pd-deploy/locks
  state:
    description: C(acquired) takes the lock (or reports its holder), C(released) gives back a lock this
      run holds, C(checked) only reports the holder.
    type: str
    choices: [acquired, released, checked]
    default: acquired
  holder:
    description: This run ({run_id, controller, user, pid, pid_start, started, and job, the AWX job id, when
      the run is an AWX / Automation Platform job}); set by the action plugin.
    type: dict
    required: true
  lock_host:
    description: The host the lock is on, for messages (read by the action plugin only).
    type: str
  break_lock:
    description:
      - Break a lock held by a run that is not alive on this controller (action plugin only; default the
        variable C(pd_deploy_break_lock)).
      - A text other than a boolean names the one holder to break - its run id, or the AWX job id it
        recorded (C(awx_job_id)) - and any other holder's lock is refused as without it.
    type: raw
  force:
    description: Replace a lock held by another run (pd_deploy_break_lock); the old holder is returned.
    type: bool
    default: false
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the cluster's deploy lock
  pd.deploy.pd_deploy_lock:
    cluster: cluster_a
"""

RETURN = r"""
acquired:
  description: This run holds the lock now.
  type: bool
  returned: always
holder:
  description: The run that holds the lock (another run's when acquired is false), or null when free.
  type: dict
  returned: always
broken:
  description: The holder whose lock was replaced (force), else null.
  type: dict
  returned: always
path:
  description: The lock file.
  type: str
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_lock import create, read_holder, release


def main():
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "dir": {"type": "path", "default": "/var/lib/pd-deploy/locks"},
            "state": {"type": "str", "choices": ["acquired", "released", "checked"], "default": "acquired"},
            "holder": {"type": "dict", "required": True},
            "force": {"type": "bool", "default": False},
            # the action plugin takes these two out before the module runs (messages, breaking a stale
            # lock); declared so that the spec is the page's
            "lock_host": {"type": "str"},
            "break_lock": {"type": "raw"},
        },
        supports_check_mode=True,
    )
    p = module.params
    cluster, mine = p["cluster"], p["holder"]
    if not cluster or "/" in cluster or cluster.startswith("."):
        module.fail_json(msg=f"cluster {cluster!r} is not a usable lock file name")
    path = os.path.join(p["dir"], f"{cluster}.lock")
    out = {"path": path, "acquired": False, "holder": None, "broken": None, "changed": False}
    found = read_holder(path)
    ours = found is not None and found.get("run_id") == mine.get("run_id")
    if p["state"] == "checked" or module.check_mode:
        module.exit_json(**{**out, "holder": found, "acquired": ours})
    if p["state"] == "released":
        released, found = release(path, mine.get("run_id"))
        module.exit_json(**{**out, "changed": released, "holder": None if released else found})
    if ours:
        module.exit_json(**{**out, "acquired": True, "holder": found})
    try:
        os.makedirs(p["dir"], mode=0o755, exist_ok=True)
        if found is not None and p["force"]:
            os.unlink(path)
            out["broken"] = found
        if create(path, mine):
            module.exit_json(**{**out, "acquired": True, "holder": mine, "changed": True})
    except OSError as exc:
        module.fail_json(msg=f"cannot write the deploy lock {path}: {exc} — check that {p['dir']} is writable "
                             "(pd_rollout_lock_dir)", path=path)
    module.exit_json(**{**out, "holder": read_holder(path) or found or {}})


if __name__ == "__main__":
    main()
