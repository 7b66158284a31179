#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the logs of several containers through the Docker Engine API in one module run."""

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
        },
        supports_check_mode=True,  # only reads
    )
    p = module.params
    tail = str(p["tail"]).strip()
    if tail != "all" and not tail.isdigit():
        module.fail_json(msg=f"tail: {tail!r} is neither a number of lines nor 'all'")
    module.exit_json(changed=False, logs=read_logs(p["docker_socket"], p["names"], tail))


if __name__ == "__main__":
    main()
