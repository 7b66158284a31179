# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules on placement and ports: instances fit their hosts, ports and KV port ranges unique per
machine and out of the transport windows, and drain timing the proxy can honour."""

from ...plan import ports
from ...shared.errors import PdError
from ..violation import violation
from .context import ROLES, _instances, _is_int, _is_number, _overlap, _role_hosts, _where


def _kv_claims(ctx):
    """(machine, lo, hi, role, index, host) of each Mooncake instance on each machine it runs on
    (host networking: ports are the machine's, however the inventory splits it into hosts)."""
    claims = []
    for inst in _instances(ctx):
        role = inst.get("role")
        if role not in ROLES or ctx["roles"][role].get("mooncake") is not True:
            continue
        port, dp, tp = inst.get("kv_port"), inst.get("dp"), inst.get("tp")
        if not (_is_int(port) and _is_int(dp) and _is_int(tp)):
            continue
        hosts = {}
        for rank in inst.get("ranks") or []:
            hosts.setdefault(ports.port_space_of(ctx["topo"], rank.get("host"), rank.get("address")), rank.get("host"))
        for address, host in hosts.items():
            claims.append((address, port, port + dp * tp, role, inst.get("index"), host))
    return claims


def rule_kv_port_ranges(ctx):
    """kv_port .. kv_port + dp x tp of instances on one machine must not overlap."""
    out = []
    claims = _kv_claims(ctx)
    for i, (addr, lo, hi, role, index, host) in enumerate(claims):
        for o_addr, o_lo, o_hi, o_role, o_index, _o_host in claims[:i]:
            if addr == o_addr and _overlap(lo, hi, o_lo, o_hi) and (role, index) != (o_role, o_index):
                out.append(violation("error", _where(ctx, role, index, host), f"{role}.kv_port",
                                     f"kv ports {lo}..{hi - 1} overlap {o_role} instance {o_index}'s {o_lo}..{o_hi - 1} "
                                     f"on {addr}",
                                     f"move {role}.kv_port to {o_hi} or above (each instance takes dp x tp ports)"))
    return out


def rule_port_windows(ctx):
    """Ports vs the windows Mooncake and HCCL draw from, per host address (plugins/plugin_utils/ports.py).

    kv ports strictly above Mooncake's Ascend transport window (sized by the image's Mooncake
    version and the ranks' device ids), rendered ports outside every window, one HCCL window per
    instance on a shared host, nothing past 65535.
    """
    try:
        return ports.check(ports.claims(ctx["cluster"], ctx["topo"], ctx["row"]))
    except PdError as exc:
        return [violation("error", exc.where, exc.field, exc.problem, exc.fix or "see plugins/plugin_utils/data/ports.yml")]


def rule_topology_fit(ctx):
    """tp divides each host's NPUs and instances x dp ranks fit the role's hosts."""
    out = []
    for role in ROLES:
        rcfg = ctx["roles"][role]
        tp, dp, count = rcfg["tp"], rcfg["dp"], rcfg["instances"]
        if not all(_is_int(x) and x >= 1 for x in (tp, dp, count)):
            out.append(violation("error", _where(ctx, role), f"{role}.tp",
                                 f"instances/dp/tp {count!r}/{dp!r}/{tp!r} are not whole numbers >= 1",
                                 "set instances, dp and tp to whole numbers >= 1"))
            continue
        hosts = _role_hosts(ctx, role)
        slots = 0
        for host in hosts:
            npus = host.get("npus")
            if not _is_int(npus):
                continue
            if npus % tp:
                out.append(violation("error", _where(ctx, role, host=host.get("name")), f"{role}.tp",
                                     f"tp {tp} does not divide the host's {npus} NPUs",
                                     "choose tp that divides pd_npus (4 or 8 on an 8-NPU host)"))
            slots += npus // tp
        if count * dp > slots:
            names = ", ".join(str(h.get("name")) for h in hosts) or "none"
            out.append(violation("error", _where(ctx, role), f"{role}.instances",
                                 f"{count} instance(s) of DP{dp} x TP{tp} need {count * dp * tp} NPUs but the {role} hosts "
                                 f"({names}) have {slots * tp} usable",
                                 f"add hosts to the '{role}' group or lower {role}.instances / dp"))
    return out


def _single_claims(ctx):
    """(machine, port, label, field, where) of every HTTP, DP RPC and proxy port of the cluster."""
    claims = []
    topo = ctx["topo"]
    for inst in _instances(ctx):
        role, index = inst.get("role"), inst.get("index")
        for rank in inst.get("ranks") or []:
            claims.append((ports.port_space_of(topo, rank.get("host"), rank.get("address")), rank.get("port"),
                           f"{rank.get('container')} http", f"{role}.port_base",
                           _where(ctx, role, index, rank.get("host"))))
        if inst.get("dp_address") is not None:
            first = (inst.get("ranks") or [{}])[0]
            claims.append((ports.port_space_of(topo, first.get("host"), inst.get("dp_address")),
                           inst.get("dp_rpc_port"), f"{role} instance {index} dp rpc",
                           f"{role}.dp_rpc_port", _where(ctx, role, index)))
    proxy = ctx["cluster"]["proxy"]
    host_name = proxy.get("host") or next(
        (n for n, h in ctx["topo"]["hosts"].items() if h.get("role") == "prefill"), None)
    host = ctx["topo"]["hosts"].get(host_name)
    if host is not None:
        claims.append((ports.port_space_of(ctx["topo"], host_name), proxy.get("port"), "proxy", "proxy.port",
                       f"{ctx['name']}@{host_name}"))
    return claims


def rule_ports_unique(ctx):
    """HTTP, DP RPC and proxy ports are unique per machine and stay out of kv port ranges."""
    out = []
    claims = [c for c in _single_claims(ctx) if _is_int(c[1])]
    for i, (addr, port, label, field, where) in enumerate(claims):
        for o_addr, o_port, o_label, _o_field, _o_where in claims[:i]:
            if addr == o_addr and port == o_port:
                out.append(violation("error", where, field, f"port {port} of {label} is also used by {o_label} on {addr}",
                                     "give each role distinct port_base / dp_rpc_port ranges and the proxy its own port"))
        for k_addr, lo, hi, k_role, k_index, _k_host in _kv_claims(ctx):
            if addr == k_addr and lo <= port < hi:
                out.append(violation("error", where, field,
                                     f"port {port} of {label} lies in {k_role} instance {k_index}'s kv ports "
                                     f"{lo}..{hi - 1} on {addr}",
                                     "move port_base / dp_rpc_port / proxy.port away from the kv_port ranges"))
    return out


#: the proxy's --waiting-retry-interval default (vllm-ascend v0.23.0 and main:
#: examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py, `default=10`)
PROXY_WAITING_RETRY_DEFAULT_S = 10


def rule_drain_timing(ctx):
    """A drain that cannot finish: the proxy's NodeListener lists an added rank (and finalizes a removed
    one) once per --waiting-retry-interval (time.sleep at the end of its loop, same upstream file), so
    a drain_timeout_s not above it ends every drain on its bound."""
    proxy = ctx["cluster"].get("proxy") or {}
    drain = proxy.get("drain_timeout_s")
    interval = proxy.get("waiting_retry_interval")
    shown = interval
    if interval is None:
        interval, shown = PROXY_WAITING_RETRY_DEFAULT_S, f"null (the proxy's default {PROXY_WAITING_RETRY_DEFAULT_S} s)"
    if not _is_number(drain) or not _is_number(interval) or drain <= 0 or interval < drain:
        return []
    return [violation("warning", ctx["name"], "proxy.waiting_retry_interval",
                      f"{shown} is not shorter than proxy.drain_timeout_s {drain}: the proxy looks at added and removed "
                      "ranks once per interval, so every drain of a rolling update ends on its timeout, not when the "
                      "rank is drained or listed again",
                      f"set proxy.waiting_retry_interval well below drain_timeout_s (e.g. {max(1, drain // 6)}) or raise "
                      "proxy.drain_timeout_s")]
