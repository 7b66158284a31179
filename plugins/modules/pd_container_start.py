#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Start every container of a host that does not run its launch spec in one module run, through the
Docker Engine API, at the same time (issue 24: a prefill host started its engine rank, then its proxy,
in two docker_container runs one after the other, about 0.6 s each)."""

DOCUMENTATION = r"""
module: pd_container_start
short_description: Create and start a host's containers from their launch specs, together, through the Docker API socket
description:
  - One module run for every container of C(containers), each in its own thread. A container is created
    and started when none of that name exists; started when one exists with the same labels but does not
    run; stopped, removed and created again when one exists with other labels (the spec hash label is the
    single source of truth, as C(community.docker.docker_container) with strict label comparison and every
    other option ignored, which role pd_container used before and still uses to pull).
  - Labels the container inherits from its image are not compared (as C(image_label_mismatch=ignore)).
  - Only the options a launch spec sets are sent (C(container_default_behavior=no_defaults)); the image
    must be on the host (no pull; role pd_image pulls before the prechecks).
  - Every container is tried; the module fails after that when any could not be started, naming each with
    what Docker answered.
options:
  containers:
    description:
      - 'What to start - name, image, command (argv list), env (dict), devices (C(host[:container[:permissions]])),
        volumes (C(source:target[:mode])), shm_size_bytes, network_mode, privileged, restart_policy, labels.'
      - The launch specs of the plan with the image, env and labels they are started with (filter pd_start_requests).
    type: list
    elements: dict
    required: true
  docker_socket:
    description: Docker Engine API socket.
    type: path
    default: /var/run/docker.sock
  stop_timeout:
    description: Seconds Docker waits for a container with other labels to stop before it kills it (then it is removed).
    type: int
    default: 10
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the containers of this host that do not run their launch spec
  pd.deploy.pd_container_start:
    containers: "{{ pd_container_plan.start | pd.deploy.pd_start_requests(images, pulled, containers) }}"
"""

RETURN = r"""
containers:
  description: One entry per container, in order - name, action (created, started, recreated, none, or failed)
    and, when Docker refused, error.
  type: list
  returned: always
"""

import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_http import docker


def parse_device(text):
    """``host[:container[:permissions]]`` as Docker's HostConfig.Devices entry (permissions rwm by default)."""
    parts = str(text).split(":")
    host = parts[0]
    inside = parts[1] if len(parts) > 1 and parts[1] else host
    return {"PathOnHost": host, "PathInContainer": inside, "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm"}


def create_body(spec):
    """The Engine API's container create request for a launch spec: only the options the spec sets."""
    host = {"NetworkMode": spec.get("network_mode") or "default",
            "Privileged": bool(spec.get("privileged")),
            "RestartPolicy": {"Name": spec.get("restart_policy") or "no"}}
    if spec.get("devices"):
        host["Devices"] = [parse_device(d) for d in spec["devices"]]
    if spec.get("volumes"):
        host["Binds"] = [str(v) for v in spec["volumes"]]
    if spec.get("shm_size_bytes"):
        host["ShmSize"] = int(spec["shm_size_bytes"])
    # attached output as docker_container creates containers (the log driver keeps it either way)
    body = {"Image": spec["image"], "Labels": {k: str(v) for k, v in (spec.get("labels") or {}).items()},
            "AttachStdout": True, "AttachStderr": True, "HostConfig": host}
    if spec.get("command"):
        body["Cmd"] = [str(a) for a in spec["command"]]
    if spec.get("env"):
        body["Env"] = [f"{k}={v}" for k, v in spec["env"].items()]
    return body


def same_labels(found, image_labels, wanted):
    """Whether a container's labels are those it would be created with: ``wanted`` over what its image gives."""
    return dict(found or {}) == dict(image_labels or {}, **wanted)


def _answer(status, body, error):
    if error:
        return error
    message = body.get("message") if isinstance(body, dict) else None
    return f"Docker API answered HTTP {status}" + (f": {message}" if message else "")


def start_one(sock, spec, check_mode, stop_timeout):
    """Bring one container to its launch spec: (action, error text or '')."""
    name = spec["name"]
    quoted = urllib.parse.quote(name, safe="")
    status, found, error = docker(sock, "GET", f"/containers/{quoted}/json")
    if status not in (200, 404):
        return "failed", f"cannot read it: {_answer(status, found, error)}"
    action = "created"
    if status == 200:
        image_id = (found or {}).get("Image") or ""
        istatus, image, _err = docker(sock, "GET", f"/images/{urllib.parse.quote(image_id, safe='/:@')}/json")
        image_labels = ((image or {}).get("Config") or {}).get("Labels") if istatus == 200 else {}
        if same_labels(((found or {}).get("Config") or {}).get("Labels"), image_labels, create_body(spec)["Labels"]):
            if ((found or {}).get("State") or {}).get("Running"):
                return "none", ""
            action = "started"
        else:
            action = "recreated"
    if check_mode:
        return action, ""
    if action == "recreated":
        status, body, error = docker(sock, "POST", f"/containers/{quoted}/stop?t={int(stop_timeout)}",
                                     timeout=stop_timeout + 30)
        if status not in (204, 304, 404):
            return "failed", f"cannot stop the container with other labels: {_answer(status, body, error)}"
        status, body, error = docker(sock, "DELETE", f"/containers/{quoted}?force=1", timeout=60)
        if status not in (204, 404):
            return "failed", f"cannot remove the container with other labels: {_answer(status, body, error)}"
    if action != "started":
        status, body, error = docker(sock, "POST", f"/containers/create?name={quoted}", timeout=60,
                                     body=create_body(spec))
        if status != 201:
            return "failed", f"Docker refused to create it: {_answer(status, body, error)}"
    status, body, error = docker(sock, "POST", f"/containers/{quoted}/start", timeout=60)
    if status not in (204, 304):
        return "failed", f"Docker refused to start it: {_answer(status, body, error)}"
    return action, ""


def start_all(sock, specs, check_mode=False, stop_timeout=10):
    """[{name, action[, error]}] for every spec, each started in its own thread."""
    if not specs:
        return []
    with ThreadPoolExecutor(max_workers=min(len(specs), 8)) as pool:
        done = list(pool.map(lambda s: start_one(sock, s, check_mode, stop_timeout), specs))
    out = []
    for spec, (action, error) in zip(specs, done):
        entry = {"name": spec["name"], "action": action}
        if error:
            entry["error"] = error
        out.append(entry)
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "containers": {"type": "list", "elements": "dict", "required": True},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
            "stop_timeout": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )
    p = module.params
    bad = [i for i, s in enumerate(p["containers"]) if not s.get("name") or not s.get("image")]
    if bad:
        module.fail_json(msg=f"containers: item(s) {bad} have no name or image; pass the plan's launch specs "
                             "through the pd_start_requests filter")
    results = start_all(p["docker_socket"], p["containers"], module.check_mode, p["stop_timeout"])
    changed = any(r["action"] not in ("none", "failed") for r in results)
    failed = [r for r in results if r["action"] == "failed"]
    if failed:
        module.fail_json(msg="; ".join(f"{r['name']}: {r['error']}" for r in failed)
                         + f" (Docker at unix://{p['docker_socket']})", containers=results, changed=changed)
    module.exit_json(changed=changed, containers=results)


if __name__ == "__main__":
    main()
