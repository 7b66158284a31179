# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the inventory may say about a host, and what it must say: fail closed, never guess.

- Required host facts have no default: an IP address for HCCL (``pd_host_address`` or ``ansible_host``,
  an IP literal: ``HCCL_IF_IP`` and the proxy's backend lists take it as is), the HCCL NIC
  (``pd_hccl_if``) and the host's RAM (``pd_host_ram``). A missing one is a violation naming host, field
  and fix.
- Every ``pd_*`` variable a host sees must be known: a host fact (``HOST_FACTS``), ``pd_cluster``, a
  public default of a role (``roles/*/defaults/main.yml``, kept equal to ``meta/argument_specs.yml`` by
  tests/unit/plugins/plugin_utils/validate/test_schema.py) or a playbook switch of ``plugins/plugin_utils/data/variables.yml`` (the one
  documented list). ``pd_hostram`` is refused by name instead of silently ignored.
- Two host entries on one machine (``pd_machine``, default: the address) must not share NPUs, and the
  pinned offload of every container of the machine must fit its RAM.
"""

import ipaddress

from ..shared import datafiles, sizes
from ..shared.errors import PdError
from .violation import violation

#: Host facts the model reads (plugins/plugin_utils/schemas/host.schema.json describes each).
HOST_FACTS = ("pd_host_address", "pd_npus", "pd_npu_first", "pd_hbm_per_npu", "pd_npu_chip", "pd_host_ram",
              "pd_host_ram_reserve", "pd_hccl_if", "pd_ascend_root", "pd_machine")
#: Facts without a default: (field, what it is, how to fix).
REQUIRED = (
    ("pd_hccl_if", "the NIC HCCL, Gloo and TP sockets use (GLOO/TP/HCCL_SOCKET_IFNAME)",
     "set pd_hccl_if: <interface> (e.g. enp189s0f0, the NIC that holds the host's HCCL address) in host_vars"),
    ("pd_host_ram", "the host's RAM, which must hold the pinned CPU offload plus pd_host_ram_reserve",
     "set pd_host_ram: <size> (e.g. 512GiB; `free -g` on the host) in host_vars"),
)

#: Variables naming a path ON THE HOSTS (a relative one resolves against the remote user's home or
#: the module's working directory: two operators would not share a lock directory). pd_ascend_root is a
#: host fact, checked in fact_violations.
HOST_PATH_VARS = ("pd_deploy_lock_dir", "pd_rollout_lock_dir", "pd_docker_socket", "pd_container_docker_socket",
                  "pd_ops_docker_socket", "pd_prechecks_docker_socket", "pd_rollout_docker_socket",
                  "pd_prechecks_docker_daemon_json", "pd_image_remote_dir", "pd_image_docker_socket",
                  "pd_bootstrap_docker_socket", "pd_bootstrap_docker_daemon_json", "pd_bootstrap_limits_file")
#: Variables naming a path on the controller (reports, build files, the image tarball): relative to
#: the directory ansible-playbook runs in, which is the operator's own choice.
CONTROLLER_PATH_VARS = ("pd_plan_build_dir", "pd_ops_reports_dir", "pd_baseline_reports_dir",
                        "pd_capacity_reports_dir", "pd_health_reports_dir", "pd_gate_reports_dir",
                        "pd_tune_reports_dir", "pd_gate_prompts_file", "pd_image_archive", "pd_log_dir",
                        "pd_monitoring_dir")


def documented_variables():
    """{name: description} of plugins/plugin_utils/data/variables.yml: every playbook switch and shared variable."""
    data = datafiles.yaml_data("variables.yml")
    return {name: entry["description"] for name, entry in data["variables"].items()}


def shared_default(name):
    """The default of a shared variable of plugins/plugin_utils/data/variables.yml (its ``default``), the one place
    it is written (pd_docker_socket: every role and playbook reads it from the plan)."""
    return datafiles.yaml_data("variables.yml")["variables"][name]["default"]


def role_defaults():
    """Names of every role's public defaults and argument_specs options (``pd_<role>_*``).

    Read from plugins/plugin_utils/data/role_variables.yml, not from roles/ at run time: the package
    reads only its own files. ``make docs`` (tools/variable_reference.py) writes that file from
    roles/*/defaults/main.yml and meta/argument_specs.yml; tests/unit/test_variable_reference.py fails
    while it is stale.
    """
    return {name for names in datafiles.yaml_data("role_variables.yml")["roles"].values() for name in names}


def known_variables():
    """Every ``pd_*`` name a host may carry: host facts, pd_cluster, role defaults, documented switches."""
    return set(HOST_FACTS) | {"pd_cluster"} | role_defaults() | set(documented_variables())


def unknown_keys(hosts_keys, known):
    """Violations for the ``pd_*`` names no role, fact or switch defines; ``hosts_keys`` is
    {host: [key names]}. A name many hosts carry (group_vars, -e) is reported once."""
    seen = {}
    for host, keys in hosts_keys.items():
        for key in keys:
            if isinstance(key, str) and key.startswith("pd_") and key not in known:
                seen.setdefault(key, []).append(host)
    out = []
    for key in sorted(seen):
        names = seen[key]
        host = ", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} other hosts"
        close = sorted(k for k in known if _close(key, k))
        hint = f"did you mean {' or '.join(close[:3])}? " if close else ""
        out.append(violation("error", host, key, f"unknown variable {key!r}: no role, host fact or playbook switch reads it",
                             f"{hint}remove or rename it (host facts: plugins/plugin_utils/schemas/host.schema.json; switches: "
                             "plugins/plugin_utils/data/variables.yml; role variables: roles/*/defaults/main.yml)"))
    return out


def _close(a, b):
    """Crude typo match: same letters once underscores are dropped, or one edit apart."""
    x, y = a.replace("_", ""), b.replace("_", "")
    if x == y:
        return True
    if abs(len(x) - len(y)) > 1:
        return False
    if len(x) == len(y):
        diff = [i for i, (p, q) in enumerate(zip(x, y)) if p != q]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and x[diff[0]] == y[diff[1]] and x[diff[1]] == y[diff[0]]
        return len(diff) == 1 or swapped
    short, long_ = (x, y) if len(x) < len(y) else (y, x)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def host_address(name, hv):
    """The host's IP literal for HCCL_IF_IP and the proxy's backend lists, or raise PdError."""
    value = hv.get("pd_host_address")
    field = "pd_host_address"
    if value is None:
        value, field = hv.get("ansible_host"), "ansible_host"
    if value is None:
        raise PdError(name, "pd_host_address",
                      "no IP address: neither pd_host_address nor ansible_host is set (HCCL_IF_IP needs the "
                      "host's address, not its inventory name)",
                      "set ansible_host: <IP> or pd_host_address: <IP of the HCCL NIC> in host_vars")
    try:
        return str(ipaddress.ip_address(str(value).strip()))
    except ValueError:
        raise PdError(name, field, f"{value!r} is not an IP address (HCCL_IF_IP and the proxy need an IP literal)",
                      "set pd_host_address: <IP of the HCCL NIC> (keep ansible_host as the SSH name if you like)") \
            from None


def fact_violations(name, hv):
    """Violations for missing or unusable required host facts (no silent default)."""
    out = []
    try:
        address = host_address(name, hv)
    except PdError as exc:
        out.append(violation("error", exc.where, exc.field, exc.problem, exc.fix))
    else:
        if ":" in address:
            # vllm-ascend's proxy splits each instance of /instances/add|remove at ":" into exactly two parts
            # (parse_server_addresses, v0.23.0 .. main 182b75ea84): an IPv6 instance gets HTTP 500
            out.append(violation("warning", name, "pd_host_address" if hv.get("pd_host_address") is not None else "ansible_host",
                                 f"{address} is an IPv6 address: the proxy takes it on its command line, but cannot add or "
                                 "remove it while it runs, so rolling updates cannot drain these ranks and a scale-out "
                                 "cannot add them without recreating the proxy",
                                 "set pd_host_address: <IPv4 address of the NIC> (docs/guide/deploy.md, Downtime of a rollout)"))
    for field, what, fix in REQUIRED:
        if hv.get(field) is None:
            out.append(violation("error", name, field, f"missing: {what} has no default", fix))
    for field in ("pd_hbm_per_npu", "pd_host_ram"):
        try:
            zero = hv.get(field) is not None and sizes.to_bytes(hv[field], field=field, where=name) == 0
        except PdError:
            zero = False  # the shape check names the bad value
        if zero:
            out.append(violation("error", name, field, "is 0: no capacity can be planned with it",
                                 f"set {field} to the host's real value (e.g. 64GiB HBM per 910B3 NPU)"))
    root = hv.get("pd_ascend_root")
    if isinstance(root, str) and root and not root.startswith("/"):
        out.append(violation("error", name, "pd_ascend_root", f"{root!r} is a relative path (Docker would resolve it "
                             "against its own working directory)", "write an absolute path, or leave it empty for /"))
    return out


def path_violations(name, hv):
    """Host-side path variables (HOST_PATH_VARS) that are not absolute paths."""
    out = []
    for field in HOST_PATH_VARS:
        value = hv.get(field)
        if value is None:
            continue
        if not isinstance(value, str) or not value.startswith("/"):
            out.append(violation("error", name, field, f"{value!r} is not an absolute path: on the host it resolves "
                                 "against the remote user's directory, so runs as another user see another one",
                                 f"write an absolute path (e.g. {_PATH_EXAMPLES.get(field, '/var/lib/pd-deploy')})"))
    return out


_PATH_EXAMPLES = {"pd_deploy_lock_dir": "/var/lib/pd-deploy/locks", "pd_rollout_lock_dir": "/var/lib/pd-deploy/locks",
                  "pd_prechecks_docker_daemon_json": "/etc/docker/daemon.json",
                  "pd_image_remote_dir": "/var/tmp/pd-images",
                  "pd_bootstrap_docker_daemon_json": "/etc/docker/daemon.json",
                  "pd_bootstrap_limits_file": "/etc/security/limits.d/90-pd-deploy.conf"}
for _name in HOST_PATH_VARS:
    if _name.endswith("_socket"):
        _PATH_EXAMPLES[_name] = shared_default("pd_docker_socket")


def machine_violations(hosts, specs):
    """Two host entries on one machine sharing NPUs, or pinned offload the machine's RAM cannot hold.

    ``hosts`` are host records (name, machine, npus, npu_first, ram_bytes, ram_reserve_bytes); ``specs``
    every launch spec of the fleet (host, pinned_offload_bytes).
    """
    out = []
    machines = {}
    for host in hosts:
        machines.setdefault(host["machine"], []).append(host)
    pinned = {}
    for spec in specs:
        pinned[spec["host"]] = pinned.get(spec["host"], 0) + (spec.get("pinned_offload_bytes") or 0)
    for machine, members in machines.items():
        if len(members) < 2:
            continue
        names = ", ".join(h["name"] for h in members)
        for i, a in enumerate(members):
            a_devs = set(range(a["npu_first"], a["npu_first"] + a["npus"]))
            for b in members[i + 1:]:
                shared = sorted(a_devs & set(range(b["npu_first"], b["npu_first"] + b["npus"])))
                if shared:
                    out.append(violation("error", b["name"], "pd_npu_first",
                                         f"{a['name']} and {b['name']} are one machine ({machine}) and both claim NPU(s) "
                                         f"{_ranges(shared)}",
                                         "list each machine once, or give the entries disjoint NPUs (pd_npu_first / "
                                         "pd_npus), or set pd_machine if they really are different machines"))
        total = sum(pinned.get(h["name"], 0) for h in members)
        ram = min(h["ram_bytes"] for h in members)
        reserve = max(h["ram_reserve_bytes"] for h in members)
        if total and total + reserve > ram:
            out.append(violation("error", members[0]["name"], "pd_host_ram",
                                 f"{names} are one machine ({machine}): their containers pin {sizes.to_human(total)} of "
                                 f"offload together, plus pd_host_ram_reserve {sizes.to_human(reserve)}, above its RAM "
                                 f"{sizes.to_human(ram)}",
                                 "lower cpu_offload of the roles sharing the machine, or list the machine once"))
    return out


def _ranges(ids):
    return ",".join(str(i) for i in ids[:8]) + (" ..." if len(ids) > 8 else "")
