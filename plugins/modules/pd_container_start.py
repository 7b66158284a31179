#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Start every container of a host that does not run its launch spec in one module run, through the
Docker Engine API, at the same time (issue 24: a prefill host started its engine rank, then its proxy,
in two docker_container runs one after the other, about 0.6 s each).

The same run first does what a replacement needs before it (remove, preserve, pin) and what a rollback
does (remove, restore): role pd_container ran those as a task per container and step (a stale previous
removed, the old one stopped, pinned, renamed: four module runs per replaced container, one after the
other), 0.3-0.5 s each on a quiet 2-core machine and over 2 s on a busy one."""

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
  - Before the start, in this order, each step for every name at once (a thread each), and the next step only
    when every container of the step succeeded, else the module fails naming each refusal and starts nothing -
    O(remove), O(preserve), O(restore), O(previous).
  - In check mode nothing is changed; the result says what would be started (C(containers)).
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
    description: Seconds Docker waits for a container to stop before it kills it (one with other labels, then
      removed; one kept by O(preserve)).
    type: int
    default: 10
  remove:
    description: Containers removed first, running or not (a replacement an earlier run left half done; the
      unhealthy containers of a rollback). One that does not exist is fine.
    type: list
    elements: str
    default: []
  preserve:
    description:
      - Containers kept for rollback before their launch spec's container is started - each is stopped, its
        restart policy set to C(no) and renamed C(<name>-previous); a C(<name>-previous) an earlier run left is
        removed first.
    type: list
    elements: str
    default: []
  restore:
    description:
      - Rollback - each C(<name>-previous) is renamed back to C(<name>), given its launch spec's restart policy
        again (kept as C(no) while it was the previous one) and started. C(<name>) must be gone (O(remove)).
      - 'A dict of C(name: restart policy).'
    type: dict
    default: {}
  previous:
    description: Names whose C(<name>-previous) is kept after this run (the rollback targets) - its restart
      policy is set to C(no), so neither Docker nor a daemon restart starts it beside the new one.
    type: list
    elements: str
    default: []
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Start the containers of this host that do not run their launch spec
  pd.deploy.pd_container_start:
    containers: "{{ pd_container_plan.start | pd.deploy.pd_start_requests(images, pulled, containers) }}"
"""

RETURN = r"""
steps:
  description: One entry per step done before the start - name, step (removed, preserved, restored or pinned)
    and, when Docker refused, error.
  type: list
  returned: always
containers:
  description: One entry per container, in order - name, action (created, started, recreated, none, or failed)
    and, when Docker refused, error.
  type: list
  returned: always
"""

import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_http import answer_text, docker, remove_container
from ansible_collections.pd.deploy.plugins.module_utils.pd_launch import PREVIOUS


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


def start_one(sock, spec, check_mode, stop_timeout):
    """Bring one container to its launch spec: (action, error text or '')."""
    name = spec["name"]
    quoted = urllib.parse.quote(name, safe="")
    status, found, error = docker(sock, "GET", f"/containers/{quoted}/json")
    if status not in (200, 404):
        return "failed", f"cannot read it: {answer_text(status, found, error)}"
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
        error = (_call(sock, "POST", f"/containers/{quoted}/stop?t={int(stop_timeout)}", (204, 304, 404),
                       "stop the container with other labels", timeout=stop_timeout + 30)
                 or _call(sock, "DELETE", f"/containers/{quoted}?force=1", (204, 404),
                          "remove the container with other labels"))
        if error:
            return "failed", error
    if action != "started":
        status, body, error = docker(sock, "POST", f"/containers/create?name={quoted}", timeout=60,
                                     body=create_body(spec))
        if status != 201:
            return "failed", f"Docker refused to create it: {answer_text(status, body, error)}"
    status, body, error = docker(sock, "POST", f"/containers/{quoted}/start", timeout=60)
    if status not in (204, 304):
        return "failed", f"Docker refused to start it: {answer_text(status, body, error)}"
    return action, ""


def _each(items, work):
    """``work(item)`` for every item, each in its own thread, results in order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(len(items), 8)) as pool:
        return list(pool.map(work, items))


def start_all(sock, specs, check_mode=False, stop_timeout=10):
    """[{name, action[, error]}] for every spec, each started in its own thread."""
    done = _each(specs, lambda s: start_one(sock, s, check_mode, stop_timeout))
    out = []
    for spec, (action, error) in zip(specs, done):
        entry = {"name": spec["name"], "action": action}
        if error:
            entry["error"] = error
        out.append(entry)
    return out


def _call(sock, method, path, ok, what, timeout=60, body=None):
    """One Docker call of a step: '' when its status is one of ``ok``, else what went wrong in words."""
    status, answer, error = docker(sock, method, path, timeout=timeout, body=body)
    return "" if status in ok else f"cannot {what}: {answer_text(status, answer, error)}"


def _policy(sock, name, policy):
    return _call(sock, "POST", f"/containers/{urllib.parse.quote(name, safe='')}/update", (200,),
                 f"set the restart policy of {name} to {policy}", body={"RestartPolicy": {"Name": policy}})


def remove_one(sock, name, _stop_timeout=10):
    """Remove a container, running or not (gone already is fine): error text or ''."""
    return remove_container(sock, name)


def preserve_one(sock, name, stop_timeout=10):
    """Keep ``name`` for rollback: a stale ``<name>-previous`` removed, ``name`` stopped, pinned (restart
    policy no) and renamed ``<name>-previous``. Error text or ''.

    The pin comes before the rename: a run killed between two calls never leaves ``<name>-previous`` with
    restart policy always/unless-stopped (a daemon restart would start it on its rank's port and NPUs); a kill
    between the stop and the pin leaves the old container stopped under its own name, which the next run
    replaces as any other."""
    quoted = urllib.parse.quote(name, safe="")
    return (remove_one(sock, name + PREVIOUS)
            or _call(sock, "POST", f"/containers/{quoted}/stop?t={int(stop_timeout)}", (204, 304), f"stop {name}",
                     timeout=stop_timeout + 30)
            or _policy(sock, name, "no")
            or _call(sock, "POST", f"/containers/{quoted}/rename?name={urllib.parse.quote(name + PREVIOUS, safe='')}",
                     (204,), f"rename {name} to {name}{PREVIOUS}"))


def restore_one(sock, item, _stop_timeout=10):
    """Roll back to ``<name>-previous``: renamed back, its restart policy given back, started. ``item``:
    (name, restart policy). Error text or ''."""
    name, policy = item
    kept = urllib.parse.quote(name + PREVIOUS, safe="")
    return (_call(sock, "POST", f"/containers/{kept}/rename?name={urllib.parse.quote(name, safe='')}", (204,),
                  f"rename {name}{PREVIOUS} back to {name}")
            or _policy(sock, name, policy or "no")
            or _call(sock, "POST", f"/containers/{urllib.parse.quote(name, safe='')}/start", (204, 304), f"start {name}"))


def pin_one(sock, name, _stop_timeout=10):
    """Keep ``<name>-previous`` from starting by itself (restart policy no). Error text or ''."""
    return _policy(sock, name + PREVIOUS, "no")


#: the steps before the start, in their order: (option, step word, function)
STEPS = (("remove", "removed", remove_one), ("preserve", "preserved", preserve_one),
         ("restore", "restored", restore_one), ("previous", "pinned", pin_one))


def prepare_all(sock, todo, check_mode=False, stop_timeout=10):
    """Run the steps of ``todo`` ({option: names}; restore: {name: restart policy}) in STEPS' order:
    ([{name, step[, error]}], failed entries).

    Every item of a step is tried (a thread each); a step with a refusal ends the run there."""
    done = []
    for option, word, work in STEPS:
        items = todo.get(option) or []
        items = list(items.items()) if isinstance(items, dict) else list(items)
        errors = [""] * len(items) if check_mode else _each(items, lambda i, w=work: w(sock, i, stop_timeout))
        entries = [dict({"name": i[0] if isinstance(i, tuple) else i, "step": word}, **({"error": e} if e else {}))
                   for i, e in zip(items, errors)]
        done.extend(entries)
        failed = [e for e in entries if "error" in e]
        if failed:
            return done, failed
    return done, []


def main():
    module = AnsibleModule(
        argument_spec={
            "containers": {"type": "list", "elements": "dict", "required": True},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
            "stop_timeout": {"type": "int", "default": 10},
            "remove": {"type": "list", "elements": "str", "default": []},
            "preserve": {"type": "list", "elements": "str", "default": []},
            "restore": {"type": "dict", "default": {}},
            "previous": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    bad = [i for i, s in enumerate(p["containers"]) if not s.get("name") or not s.get("image")]
    if bad:
        module.fail_json(msg=f"containers: item(s) {bad} have no name or image; pass the plan's launch specs "
                             "through the pd_start_requests filter")
    where = f" (Docker at unix://{p['docker_socket']})"
    steps, failed = prepare_all(p["docker_socket"], {k: p[k] for k in ("remove", "preserve", "restore", "previous")},
                                module.check_mode, p["stop_timeout"])
    changed = not module.check_mode and any(s["step"] != "pinned" and "error" not in s for s in steps)
    if failed:
        module.fail_json(msg="; ".join(f"{s['name']}: {s['error']}" for s in failed) + where
                         + " - nothing was started", steps=steps, containers=[], changed=changed)
    results = start_all(p["docker_socket"], p["containers"], module.check_mode, p["stop_timeout"])
    changed = changed or any(r["action"] not in ("none", "failed") for r in results)
    failed = [r for r in results if r["action"] == "failed"]
    if failed:
        module.fail_json(msg="; ".join(f"{r['name']}: {r['error']}" for r in failed) + where,
                         steps=steps, containers=results, changed=changed)
    module.exit_json(changed=changed, steps=steps, containers=results)


if __name__ == "__main__":
    main()
