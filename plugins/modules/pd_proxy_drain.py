#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Drain engine ranks out of a running PD proxy before a replacement, and put them back after."""

DOCUMENTATION = r"""
module: pd_proxy_drain
short_description: Take ranks out of a running vllm-ascend PD proxy, or put them back
description:
  - Runs on the proxy's host and talks to the proxy on O(proxy_url) (loopback) and to each rank's
    C(/metrics) at the address the proxy itself uses (C(host:port)).
  - C(state=drained) posts C(/instances/remove) and waits until each rank is no longer listed by the
    proxy, or its engine has no request running or waiting (the proxy keeps an instance it could not
    drop at once isolated, listed but picked last), at most O(timeout_s).
  - The proxy keeps a rank removed while any request is in flight listed but tainted (never picked
    while another instance serves) and ignores an add of a key it lists; so C(state=restored) adds the
    rank back under another spelling of its address (an alias with the same host and port, a key the proxy does
    not list, for example C(0xa.0.1.12:8200) for C(10.0.1.12:8200)), and the tainted key leaves the list
    when the proxy idles. Ranks are compared by the endpoint they reach, never by text.
  - C(state=wired) makes the proxy serve exactly O(want); missing instances are added first (and waited
    for), then instances it serves beyond O(want) are drained out (elastic P/D). C(state=joined) only
    adds the missing ones (before a wave drains, so a role never loses its last serving instance).
  - With O(state_file), the key each instance serves under is kept in that file on the proxy's host,
    written before a drain taints a key, so a later run tells the serving key from a tainted one (the
    proxy does not say which is tainted).
  - Never fails on a proxy that does not answer or a bound reached; the result says what happened
    (C(drained) / C(restored) / C(wired) false, C(error)). Check mode reads nothing and changes nothing.
options:
  proxy_url:
    description: Base URL of the proxy, for example C(http://127.0.0.1:8000).
    type: str
    required: true
  role:
    description: Instance type of the ranks in the proxy (C(drained), C(restored)).
    type: str
    choices: [prefill, decode]
  instances:
    description: The ranks, as the proxy lists them (C(address:port)) (C(drained), C(restored)).
    type: list
    elements: str
  want:
    description: With C(state=wired) or C(joined), the instances the proxy must serve ({prefill, decode} of
      C(address:port)).
    type: dict
  state:
    description: C(drained) takes them out, C(restored) puts them back, C(wired) re-wires to O(want),
      C(joined) adds what O(want) has and the proxy does not serve.
    type: str
    choices: [drained, restored, wired, joined]
    required: true
  state_file:
    description: File on the proxy's host recording the key each instance serves under (the proxy spec's
      C(serving_file)); empty for none. A record made for an earlier start of the O(container) is ignored.
    type: path
    default: ""
  timeout_s:
    description: Longest wait.
    type: float
    default: 60
  interval_s:
    description: Pause between two rounds of requests.
    type: float
    default: 0.5
  container:
    description: The proxy's container name; when the result is not what was asked, Docker is asked whether
      it runs (C(proxy_down)).
    type: str
    default: ""
  docker_socket:
    description: Docker's socket on this host, for O(container).
    type: path
    default: /var/run/docker.sock
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take decode rank 10.0.1.12:8200 out of the proxy
  pd.deploy.pd_proxy_drain:
    proxy_url: http://127.0.0.1:8000
    role: decode
    instances: ["10.0.1.12:8200"]
    state: drained
"""

RETURN = r"""
drained:
  description: (drained) Every rank is unlisted, or listed but isolated with nothing in flight.
  type: bool
  returned: when state is drained
removed:
  description: (drained) Ranks the proxy no longer lists.
  type: list
  returned: when state is drained
isolated:
  description: (drained) Ranks still listed, tainted (the proxy drops them when it is idle once).
  type: list
  returned: when state is drained
rejoin:
  description: (drained) {rank -> the spelling of its address it comes back under unless the proxy dropped
    the tainted key by then}.
  type: dict
  returned: when state is drained
add_as:
  description: (restored) {rank -> the spelling it was added under}.
  type: dict
  returned: when state is restored
missing_as:
  description: (restored) The spelling each rank of RV(missing) was added under (what a hand-made add must name).
  type: list
  returned: when state is restored
in_flight:
  description: (drained) Requests still running or waiting on each busy rank at the end.
  type: dict
  returned: when state is drained
restored:
  description: (restored) Every rank is listed again.
  type: bool
  returned: when state is restored
missing:
  description: (restored) Ranks not listed at the end.
  type: list
  returned: when state is restored
wired:
  description: (wired) The proxy lists O(want) (dropped instances drained, new ones listed).
  type: bool
  returned: when state is wired
serving:
  description: (wired, joined) {role -> instances the proxy serves at the end}, an alias read as the planned key.
  type: dict
  returned: when state is wired or joined
added:
  description: (wired) {role -> instances added}.
  type: dict
  returned: when state is wired
waited_s:
  description: Seconds spent.
  type: float
  returned: always
error:
  description: The proxy's last error, if it did not answer as expected.
  type: str
  returned: always
proxy_down:
  description: When the result is not what was asked, why the proxy itself is down (its container exited or
    is gone, or it does not answer at all), else empty; a message then names the proxy, not the ranks.
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_drain import drain, load_serving, proxy_down, recorder, restore, started_at, wire


def main():
    module = AnsibleModule(
        argument_spec={
            "proxy_url": {"type": "str", "required": True},
            "role": {"type": "str", "choices": ["prefill", "decode"]},
            "instances": {"type": "list", "elements": "str"},
            "want": {"type": "dict"},
            "state": {"type": "str", "choices": ["drained", "restored", "wired", "joined"], "required": True},
            "state_file": {"type": "path", "default": ""},
            "timeout_s": {"type": "float", "default": 60.0},
            "interval_s": {"type": "float", "default": 0.5},
            "container": {"type": "str", "default": ""},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
        },
        supports_check_mode=True,
        required_if=[("state", "drained", ("role", "instances")), ("state", "restored", ("role", "instances")),
                     ("state", "wired", ("want",)), ("state", "joined", ("want",))],
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, waited_s=0.0, error="", proxy_down="",
                         msg="not drained in check mode")
    url = p["proxy_url"].rstrip("/")
    path = p["state_file"]
    started = started_at(p["docker_socket"], p["container"]) if path else ""
    serving = load_serving(path, started) if path else {"prefill": {}, "decode": {}}
    record = recorder(serving, path, started)

    if p["state"] in ("wired", "joined"):
        result = wire(url, p["want"], p["timeout_s"], p["interval_s"], serving=serving, record=record,
                      drop=p["state"] == "wired")
    elif p["state"] == "drained":
        result = drain(url, p["role"], p["instances"], p["timeout_s"], p["interval_s"],
                       serving=serving.get(p["role"]), record=lambda done: record(p["role"], done))
    else:
        result = restore(url, p["role"], p["instances"], p["timeout_s"], p["interval_s"],
                         record=lambda done: record(p["role"], done))
    ok = result.get({"wired": "wired", "joined": "wired", "drained": "drained", "restored": "restored"}[p["state"]])
    result["proxy_down"] = "" if ok else proxy_down(url, p["container"], p["docker_socket"])
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
