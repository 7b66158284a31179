# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Host ports of a cluster: what pd-deploy renders and what the engines' libraries take by themselves.

Engines run with host networking, so every listener of every rank is a port of its host. Besides the
ports the launch spec names (HTTP ``--port``, ``--data-parallel-rpc-port`` on rank 0, the Mooncake
``kv_port`` range), three libraries draw listeners from fixed windows (plugins/plugin_utils/data/ports.yml):

* Mooncake's Ascend direct transport: per NPU ``base + id x stride .. base + (id + 1) x stride``,
  both ends, stride and id by Mooncake version (the image's, a column of versions.yml);
* Mooncake's P2P handshake RPC: 15000..17000;
* HCCL's host-NIC listeners: ``HCCL_IF_BASE_PORT`` (60000) and the next 31.

``claims(cluster, topo, row)`` lists every port or window of a cluster per host address;
``check(claims)`` reports a rendered port inside a reserved window, two instances sharing an HCCL
window, kv ports not strictly above the transport window, and anything past 65535. All functions
are pure; nothing is kept between calls.
"""

import re

from ..shared import datafiles
from ..shared.errors import PdError
from ..validate.violation import error

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")
ROLES = ("prefill", "decode")
#: claim kinds that pd-deploy renders (one exact port or the kv range)
RENDERED = ("http", "dp_rpc", "kv", "proxy")


def facts():
    """A fresh copy of plugins/plugin_utils/data/ports.yml."""
    return datafiles.yaml_data("ports.yml")


def _version_key(version, where="pd_mooncake_transport"):
    match = _VERSION_RE.match(str(version).strip())
    if not match:
        raise PdError(where, "mooncake_version", f"{version!r} is not a Mooncake release (e.g. 0.3.11.post1)",
                      "fix mooncake_version in plugins/plugin_utils/data/versions.yml")
    return tuple(int(g or 0) for g in match.groups())


def mooncake_transport(version):
    """The transport row of ``version`` (stride, device_id, base_port_env, source) plus the base port.

    Returns None for a Mooncake older than the Ascend direct transport. Raises PdError for a
    version string that is not a release number.
    """
    data = facts()["mooncake"]
    key = _version_key(version)
    chosen = None
    for row in data["transport"]:
        if _version_key(row["from"]) <= key:
            chosen = row
    if chosen is None:
        return None
    return dict(chosen, base_port=data["transport_base_port"])


def hccl_base_port(cluster, rank):
    """HCCL_IF_BASE_PORT of a rank: the cluster's base plus one 32-port window per instance sharing
    the rank's host address before this one (``rank["hccl_slot"]``, set by model.topology)."""
    hccl = facts()["hccl"]
    base = cluster.get("hccl_if_base_port")
    if base is None:
        base = hccl["if_base_port_default"]
    return base + (rank.get("hccl_slot") or 0) * hccl["if_port_span"]


def rank_env_port(cluster, role, name):
    """An integer port the operator set in ``env_common`` or the role's ``env``; None when unset."""
    env = dict(cluster.get("env_common") or {})
    env.update((cluster["roles"][role].get("env") or {}))
    value = env.get(name)
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def visible_ids(host, devices):
    """ASCEND_RT_VISIBLE_DEVICES of a rank: its devices numbered as its container sees them.

    Every rank container mounts all of its host's NPUs ``npu_first .. npu_first + npus - 1`` under
    their own names, and the runtime numbers the NPUs a container has from 0 in that order, so
    host NPU ``d`` is ``d - npu_first`` inside (docs/design.md "Device layout").
    """
    first = host.get("npu_first") or 0
    return [d - first for d in devices]


def machine_of(topo, host_name, address=None):
    """The physical machine a host entry is on (``pd_machine``, default its address).

    Engines run with host networking, so every port is a port of the machine, whatever number of
    host entries (and addresses) the inventory splits it into: ports are judged per machine.
    """
    host = (topo.get("hosts") or {}).get(host_name) or {}
    return str(host.get("machine") or host.get("address") or address)


def port_spaces(hosts):
    """{host name: its port space} for ``hosts``, an iterable of (name, machine, address).

    A port is taken in a network namespace: engines use host networking, so every host entry of one
    machine (``pd_machine``) shares the machine's ports, and so do entries that share an address (one
    address is one machine's, whatever pd_machine says; the Molecule hosts share 127.0.0.1). Entries
    linked by either are one space, named after the first machine of it in inventory order.
    """
    parent = {}

    def find(node):
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    rows = [(name, str(machine or address), str(address or machine)) for name, machine, address in hosts]
    for _name, machine, address in rows:
        first, second = find(("machine", machine)), find(("address", address))
        if first != second:
            parent[second] = first
    names = {}
    for _name, machine, _address in rows:
        names.setdefault(find(("machine", machine)), machine)
    return {name: names[find(("machine", machine))] for name, machine, _address in rows}


def port_space_of(topo, host_name, address=None):
    """The port space (see port_spaces) of a host entry of a cluster's topology."""
    hosts = topo.get("hosts") or {}
    if host_name not in hosts:
        return str(address)
    return port_spaces((n, h.get("machine"), h.get("address")) for n, h in hosts.items())[host_name]


def _claim(address, host, lo, hi, kind, owner, label, field, where, machine=None):
    return {"address": address, "host": host, "lo": lo, "hi": hi, "kind": kind, "owner": owner,
            "label": label, "field": field, "where": where, "machine": machine or address}


def where_label(cluster, role=None, index=None, host=None):
    """``<cluster>/<role>[/instance i][@host]``: where a violation is, as every rule names it."""
    text = cluster
    if role:
        text += f"/{role}"
    if index is not None:
        text += f"/instance {index}"
    if host:
        text += f"@{host}"
    return text


def is_int(value):
    """A whole number that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def claims(cluster, topo, row):
    """Every port and window the cluster's containers take, as claim dicts (bounds inclusive).

    ``row`` is the versions.yml row (its ``mooncake_version`` sizes the transport window); None
    skips the Mooncake windows (an unknown version is reported by its own rule).
    """
    name = cluster["name"]
    hccl = facts()["hccl"]
    moon = facts()["mooncake"]
    transport = None
    if row is not None and row.get("mooncake_version"):
        transport = mooncake_transport(row["mooncake_version"])
    out = []
    for inst in topo.get("instances") or []:
        role, index = inst.get("role"), inst.get("index")
        if role not in ROLES:
            continue
        rcfg = cluster["roles"][role]
        owner = (name, role, index)
        mooncake = rcfg.get("mooncake") is True
        for rank in inst.get("ranks") or []:
            addr, hname = rank.get("address"), rank.get("host")
            where = where_label(name, role, index, hname)
            mach = port_space_of(topo, hname, addr)
            if is_int(rank.get("port")):
                out.append(_claim(addr, hname, rank["port"], rank["port"], "http", owner,
                                  f"{rank.get('container')} http", f"{role}.port_base", where, mach))
            if rank.get("dp_rank") == 0 and is_int(inst.get("dp_rpc_port")):
                out.append(_claim(addr, hname, inst["dp_rpc_port"], inst["dp_rpc_port"], "dp_rpc", owner,
                                  f"{role} instance {index} dp rpc", f"{role}.dp_rpc_port", where, mach))
            hbase = rank_env_port(cluster, role, "HCCL_IF_BASE_PORT")
            field = f"{role}.env.HCCL_IF_BASE_PORT"
            if hbase is None:
                hbase, field = hccl_base_port(cluster, rank), "hccl_if_base_port"
            out.append(_claim(addr, hname, hbase, hbase + hccl["if_port_span"] - 1, "hccl", owner,
                              f"{role} instance {index}", field, where, mach))
            if not mooncake:
                continue
            if is_int(inst.get("kv_port")):
                lo = inst["kv_port"]
                out.append(_claim(addr, hname, lo, lo + inst["dp"] * inst["tp"] - 1, "kv", owner,
                                  f"{role} instance {index} kv ports", f"{role}.kv_port", where, mach))
            lo, hi = moon["rpc_port_range"]
            out.append(_claim(addr, hname, lo, hi, "mooncake_rpc", owner, "Mooncake's handshake RPC window",
                              f"{role}.mooncake", where, mach))
            if transport is not None and rank.get("devices"):
                host = (topo.get("hosts") or {}).get(hname) or {}
                ids = rank["devices"] if transport["device_id"] == "physical" else \
                    visible_ids(host, rank["devices"])
                base = transport["base_port"]
                if transport["base_port_env"]:
                    moved = rank_env_port(cluster, role, transport["base_port_env"])
                    base = base if moved is None else moved
                stride = transport["stride"]
                out.append(_claim(addr, hname, base + min(ids) * stride, base + (max(ids) + 1) * stride,
                                  "mooncake_transport", owner,
                                  f"Mooncake {row['mooncake_version']}'s Ascend transport window",
                                  f"{role}.env.{transport['base_port_env'] or 'ASCEND_BASE_PORT'}", where, mach))
    proxy = cluster.get("proxy") or {}
    host_name = proxy.get("host") or next(
        (n for n, h in (topo.get("hosts") or {}).items() if h.get("role") == "prefill"), None)
    host = (topo.get("hosts") or {}).get(host_name)
    if host is not None and is_int(proxy.get("port")):
        out.append(_claim(host.get("address"), host_name, proxy["port"], proxy["port"], "proxy",
                          (name, "proxy", None), "proxy", "proxy.port", f"{name}@{host_name}",
                          port_space_of(topo, host_name)))
    unique = []
    for claim in out:
        if claim not in unique:
            unique.append(claim)
    return unique


def _span(lo, hi):
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _move_fix(claim, other):
    if claim["kind"] == "hccl":
        return (f"move the HCCL window out of {_span(other['lo'], other['hi'])}: set "
                f"{claim['field']} to a base whose 32 ports are free on this host")
    return f"move {claim['field']} out of {_span(other['lo'], other['hi'])}"


def check(items, across_clusters_only=False):
    """Violations among ``items`` (claims of one cluster, or of a whole fleet).

    With ``across_clusters_only`` only pairs whose owners are different clusters are judged (what
    one cluster's own rules cannot see). Rendered ports colliding with each other are the other
    rules' (rules.rule_ports_unique, rule_kv_port_ranges, fleet.port_collisions) and not repeated.
    """
    hccl = facts()["hccl"]
    top = facts()["port_max"]
    out = []
    by_addr = {}
    for claim in items:
        by_addr.setdefault(claim.get("machine") or claim["address"], []).append(claim)
    for addr, group in by_addr.items():
        for i, b in enumerate(group):
            if not across_clusters_only:
                out.extend(_range_problems(b, hccl, top))
            for a in group[:i]:
                if across_clusters_only and a["owner"][0] == b["owner"][0]:
                    continue
                out.extend(_pair(addr, a, b))
                out.extend(_pair(addr, b, a, mirror=True))
        out.extend(_kv_above(addr, group, across_clusters_only))
    deduped = []
    for v in out:
        if v not in deduped:
            deduped.append(v)
    return deduped


def _range_problems(claim, hccl, top):
    out = []
    if claim["hi"] > top:
        fix = {"hccl": f"lower {claim['field']} (at most {hccl['if_base_port_max']})",
               "mooncake_transport": f"lower {claim['field']} or unset it (default 20000)"}.get(
            claim["kind"], f"lower {claim['field']} so its ports end at {top} or below")
        out.append(error(claim["where"], claim["field"],
                         f"ports {_span(claim['lo'], claim['hi'])} of {claim['label']} go past {top}", fix))
    if claim["kind"] == "hccl" and not hccl["if_base_port_min"] <= claim["lo"] <= hccl["if_base_port_max"]:
        out.append(error(claim["where"], claim["field"],
                         f"HCCL_IF_BASE_PORT {claim['lo']} is outside {hccl['if_base_port_min']}.."
                         f"{hccl['if_base_port_max']}, the values HCCL accepts",
                         f"set {claim['field']} between {hccl['if_base_port_min']} and {hccl['if_base_port_max']}"))
    return out


def _pair(addr, a, b, mirror=False):
    """Problem reported on ``a`` when ``a`` and ``b`` overlap (called both ways round)."""
    if not (a["lo"] <= b["hi"] and b["lo"] <= a["hi"]):
        return []
    kinds = (a["kind"], b["kind"])
    if a["kind"] in RENDERED and b["kind"] in RENDERED:
        return []  # rendered against rendered: rules.rule_ports_unique / rule_kv_port_ranges / fleet
    if a["kind"].startswith("mooncake") and b["kind"].startswith("mooncake"):
        return []  # Mooncake's own random draws; it retries a port that is taken
    if kinds == ("kv", "mooncake_transport"):
        return []  # reported once by _kv_above (kv must be strictly above the window)
    if a["kind"] == "hccl" and b["kind"] == "hccl":
        if a["owner"] == b["owner"] or mirror:
            return []
        return [error(b["where"], b["field"],
                      f"HCCL window {_span(b['lo'], b['hi'])} of {b['label']} overlaps the one of {a['label']} "
                      f"({'cluster ' + a['owner'][0] + ', ' if a['owner'][0] != b['owner'][0] else ''}"
                      f"{_span(a['lo'], a['hi'])}) on {addr}",
                      f"give each instance on a shared host its own 32-port HCCL window: set {b['field']} "
                      f"to {a['hi'] + 1} or another free base")]
    if a["kind"] in RENDERED or (a["kind"] == "hccl" and b["kind"].startswith("mooncake")):
        return [error(a["where"], a["field"],
                      f"port(s) {_span(a['lo'], a['hi'])} of {a['label']} lie in {b['label']} "
                      f"{_span(b['lo'], b['hi'])} on {addr}, which it draws from at random "
                      "('Address already in use' at start-up)",
                      _move_fix(a, b))]
    return []


def _kv_above(addr, group, across_clusters_only):
    """kv ports must lie strictly above every Mooncake transport window of the address."""
    out = []
    windows = [c for c in group if c["kind"] == "mooncake_transport"]
    for kv in (c for c in group if c["kind"] == "kv"):
        own = [w["hi"] for w in windows if w["owner"][0] == kv["owner"][0]]
        other = [w for w in windows if w["owner"][0] != kv["owner"][0]]
        pool = other if across_clusters_only else windows
        if not pool:
            continue
        low, high = min(w["lo"] for w in pool), max(w["hi"] for w in pool)
        if kv["lo"] > high or (across_clusters_only and own and kv["lo"] <= max(own)):
            continue
        out.append(error(kv["where"], kv["field"],
                         f"kv ports {_span(kv['lo'], kv['hi'])} are not above {pool[0]['label']} "
                         f"{_span(low, high)} of the NPUs in use on {addr} (Mooncake draws from it at "
                         "random, top port included; vllm-ascend asks for kv_port above it)",
                         f"set {kv['field']} >= {high + 1}"))
    return out
