#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the logs of several containers through the Docker Engine API in one module run (and give back
the deploy locks this run holds on the host, when asked: the rollout's last module run there)."""

DOCUMENTATION = r"""
module: pd_container_logs
short_description: Read containers' logs (stdout and stderr) through the Docker API socket
description:
  - One module run reads every container of C(names); a container that cannot be read (absent, engine
    down) is reported with its status and error and left out of the texts.
  - The bodies are returned base64-encoded as Docker sends them (without a TTY each chunk carries an
    8-byte stream header); the controller strips the framing with the pd_docker_logs filter.
options:
  names:
    description: Container names.
    type: list
    elements: str
    required: true
  tail:
    description: Lines from the end of each log, or C(all).
    type: str
    default: "all"
  docker_socket:
    description: Docker Engine API socket.
    type: path
    default: /var/run/docker.sock
  release_locks:
    description:
      - Deploy lock files (pd_deploy_lock) to give back after the logs are read, each only when the run
        C(lock_run_id) holds it; a lock that is gone or held by another run is left as it is.
      - The rollout's log scan is the last module run of a batch on the lock's host, so the lock goes back
        in that run instead of a pd_deploy_lock run of its own. Not in check mode (nothing is written).
    type: list
    elements: path
    default: []
  lock_run_id:
    description: The run id (pd_deploy_lock's C(holder.run_id)) whose locks C(release_locks) gives back.
    type: str
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the last 40 lines of two ranks
  pd.deploy.pd_container_logs:
    names: [pd-cluster_a-decode0-dp0, pd-cluster_a-decode0-dp1]
    tail: "40"
  register: logs
"""

RETURN = r"""
logs:
  description: One entry per name, in order - item ({name}), status (HTTP status, 0 when the engine did not
    answer), error, and content (base64 of the log body) when status is 200; the pd_docker_logs filter
    turns the list into {name - text}.
  type: list
  returned: always
"""

import base64
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_http import docker_raw
from ansible_collections.pd.deploy.plugins.module_utils.pd_lock import release


def read_logs(socket_path, names, tail):
    out = []
    query = urllib.parse.urlencode({"stdout": 1, "stderr": 1, "tail": tail})
    for name in names:
        status, body, error = docker_raw(socket_path, f"/containers/{urllib.parse.quote(name, safe='')}/logs?{query}")
        entry = {"item": {"name": name}, "status": status, "error": error}
        if status == 200:
            entry["content"] = base64.b64encode(body).decode("ascii")
        elif not error:
            entry["error"] = f"Docker API answered HTTP {status}"
        out.append(entry)
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "names": {"type": "list", "elements": "str", "required": True},
            "tail": {"type": "str", "default": "all"},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
            "release_locks": {"type": "list", "elements": "path", "default": []},
            "lock_run_id": {"type": "str"},
        },
        supports_check_mode=True,  # reads; gives back no lock in check mode
    )
    p = module.params
    tail = str(p["tail"]).strip()
    if tail != "all" and not tail.isdigit():
        module.fail_json(msg=f"tail: {tail!r} is neither a number of lines nor 'all'")
    logs = read_logs(p["docker_socket"], p["names"], tail)
    released = []
    if p["release_locks"] and not module.check_mode:
        if not p["lock_run_id"]:
            module.fail_json(msg="lock_run_id: empty; it names the run whose locks release_locks gives back", logs=logs)
        for path in p["release_locks"]:
            try:
                if release(path, p["lock_run_id"])[0]:
                    released.append(path)
            except OSError as exc:
                module.fail_json(msg=f"cannot give back the deploy lock {path}: {exc}", logs=logs, released=released)
    module.exit_json(changed=bool(released), logs=logs, released=released)


if __name__ == "__main__":
    main()
