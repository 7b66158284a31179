#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wait for several HTTP URLs at once, each until it answers or its own deadline passes."""

DOCUMENTATION = r"""
module: pd_http_wait
short_description: Wait for a host's engine health URLs together
description:
  - Polls every URL in the same rounds, so the ranks of a host are waited for side by side in one
    module run instead of one task (and one connection) per rank and per retry.
  - Never fails on an unhealthy URL; it reports each result and leaves the decision (roll back, fail)
    to the caller.
options:
  checks:
    description:
      - List of {name, url, timeout_s}; optional method (GET), body (sent as JSON), status ([200]),
        container (a Docker container name; once it has exited the check ends at once, failed),
        headers (more request headers), json_list (a key of the JSON answer that must hold a non-empty
        list, e.g. C(choices) of a completion; a failed check then carries the start of its C(answer)),
        retire (a Docker container name removed, running or not, once the check answered, the
        C(<name>-previous) a replaced rank was kept as; the result then says C(retired)).
      - A removal Docker refuses fails the module after the wait, naming it (the results come with it).
      - A C(timeout_s) of 0 sends one request (with the whole O(request_timeout)), no retry.
    type: list
    elements: dict
    required: true
  interval:
    description: Seconds between two rounds of probes (after the short first pauses, see O(first_interval)).
    type: float
    default: 5
  first_interval:
    description:
      - Seconds before the second round; the pause then doubles until it reaches O(interval). A wait
        that ends soon (a proxy, a fast rank) ends within a fraction of a second of the answer, not
        up to O(interval) later. Set to O(interval) for even rounds.
    type: float
    default: 0.25
  request_timeout:
    description: Seconds one request may take.
    type: float
    default: 5
  docker_socket:
    description: Docker Engine API socket, asked whether the containers of the checks still run.
    type: path
    default: /var/run/docker.sock
  slice_s:
    description:
      - Return after about this many seconds even when checks are still within their deadline (they
        come back with C(pending=true)); 0 waits until every check is done. Set by the action plugin
        of the same name, which waits slice after slice and prints a progress line in between.
    type: float
    default: 0
  progress_s:
    description:
      - Seconds between two progress lines on the controller (action plugin); the slice length of the
        module runs. Defaults to the play variable C(pd_health_progress_s), else 60; 0 waits in one
        module run and prints nothing.
    type: float
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait for the ranks
  pd.deploy.pd_http_wait:
    checks:
      - {name: pd-cluster_a-decode0-dp0, url: "http://127.0.0.1:8200/health", timeout_s: 1800}
      - {name: pd-cluster_a-decode0-dp1, url: "http://127.0.0.1:8201/health", timeout_s: 1800}
    interval: 5
"""

RETURN = r"""
results:
  description: One entry per check, in order (name, url, ok, status, error, attempts, waited_s; pending
    when a slice ended before the check's deadline; exited when its container stopped first; answer,
    the start of the body, when a check with json_list failed).
  type: list
  returned: always
msg:
  description: Which checks did not answer and why (a task that fails on C(all_ok) shows it), or
    C(every check answered). A wait of several slices (progress lines) names its failures in
    C(results) only.
  type: str
  returned: when the wait ran in one module run
all_ok:
  description: Whether every check answered an expected status.
  type: bool
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_http import container_gone, failed_summary, remove_container, wait_all


def retire(socket_path, checks, results, remove=remove_container):
    """Remove the ``retire`` container of every check that answered (marked ``retired`` in its result):
    the errors, in words."""
    errors = []
    for check, result in zip(checks, results):
        if check.get("retire") and result.get("ok"):
            error = remove(socket_path, check["retire"])
            if error:
                errors.append(f"{check['name']} answered, but {error}")
            else:
                result["retired"] = check["retire"]
    return errors


def main():
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "dict", "required": True},
            "interval": {"type": "float", "default": 5.0},
            "first_interval": {"type": "float", "default": 0.25},
            "request_timeout": {"type": "float", "default": 5.0},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
            "slice_s": {"type": "float", "default": 0.0},
            # read by the action plugin of the same name only (progress lines on the controller)
            "progress_s": {"type": "float"},
        },
        supports_check_mode=True,
    )
    checks = module.params["checks"]
    for index, check in enumerate(checks):
        missing = [k for k in ("name", "url", "timeout_s") if check.get(k) in (None, "")]
        if missing:
            module.fail_json(msg=f"checks[{index}] lacks {', '.join(missing)}: give name, url and timeout_s")
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, results=[], all_ok=True, msg="not probed in check mode")
    results = wait_all(checks, module.params["interval"], module.params["request_timeout"],
                       slice_s=module.params["slice_s"], first_interval=module.params["first_interval"],
                       gone=lambda name: container_gone(module.params["docker_socket"], name))
    errors = retire(module.params["docker_socket"], checks, results)
    changed = any(r.get("retired") for r in results)
    if errors:
        module.fail_json(msg="; ".join(errors) + f" (Docker at unix://{module.params['docker_socket']})",
                         changed=changed, results=results, all_ok=all(r["ok"] for r in results))
    module.exit_json(changed=changed, results=results, all_ok=all(r["ok"] for r in results),
                     msg=failed_summary(results) or "every check answered")


if __name__ == "__main__":
    main()
