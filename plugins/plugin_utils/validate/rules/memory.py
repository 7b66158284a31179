# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules on memory: HBM (gpu_memory_utilization, weights per NPU), pinned CPU offload bytes, the shm
that pins them, and the machine RAM that holds them."""

from ...plan import capacity, connectors, model, ports
from ...shared import sizes
from ...shared.errors import PdError
from ..violation import violation
from .context import GIB, ROLES, _dedupe, _is_int, _is_number, _role_hosts, _where

#: RAM kept free beside pinned offload when neither the caller nor the host record says otherwise
#: (system, the engines' own processes, page cache). The article asks >= 512 GB of RAM for 200 GB
#: of offload; plugins/plugin_utils/data/defaults.yml gives hosts 128GiB, which the host record carries.
DEFAULT_RAM_RESERVE_BYTES = 64 * GIB


#: gpu_memory_utilization: 0.85 production, 0.90 benchmark ceiling, never >= 0.95 (DOMAIN.md §4).
GMU_PRODUCTION = 0.85
GMU_WARN = 0.90
GMU_ERROR = 0.95


def rule_offload_bytes(ctx):
    """An offload connector needs bytes; bytes need a connector; Recompute needs its scheduler."""
    out = []
    for role in ROLES:
        rcfg = ctx["roles"][role]
        kind, total = rcfg.get("offload_connector"), rcfg.get("cpu_offload_bytes")
        if kind not in connectors.OFFLOAD_CONNECTORS:
            out.append(violation("error", _where(ctx, role), f"{role}.offload_connector",
                                 f"{kind!r} is not a known offload connector",
                                 f"use one of: {', '.join(connectors.OFFLOAD_CONNECTORS)}"))
            continue
        if not _is_int(total) or total < 0:
            out.append(violation("error", _where(ctx, role), f"{role}.cpu_offload",
                                 f"{total!r} is not a size", f"set {role}.cpu_offload to a size such as 200GiB, or 0"))
            continue
        if kind != "none" and total == 0:
            out.append(violation("error", _where(ctx, role), f"{role}.cpu_offload",
                                 f"{kind} is on but cpu_offload is 0",
                                 f"set {role}.cpu_offload (e.g. 200GiB per instance) or offload_connector: none"))
        if kind == "none" and total > 0:
            out.append(violation("warning", _where(ctx, role), f"{role}.cpu_offload",
                                 f"cpu_offload is {sizes.to_human(total)} but offload_connector is none: nothing uses it",
                                 f"set {role}.offload_connector, or cpu_offload: 0"))
        if kind == "RecomputeCPUOffloadConnector" and rcfg.get("recompute_scheduler") is not True:
            out.append(violation("warning", _where(ctx, role), f"{role}.recompute_scheduler",
                                 "RecomputeCPUOffloadConnector only keeps the KV of requests the recompute scheduler preempts",
                                 f"set {role}.recompute_scheduler: true"))
    return out


def rule_gpu_memory_utilization(ctx):
    """gpu_memory_utilization in (0, 1]; >= 0.95 error; >= 0.90 warning (0.85 production)."""
    out = []
    for role in ROLES:
        gmu = ctx["roles"][role]["engine"].get("gpu_memory_utilization")
        if not _is_number(gmu):
            continue  # rule_engine_types
        field = f"{role}.engine.gpu_memory_utilization"
        fix = f"set gpu_memory_utilization: {GMU_PRODUCTION} (production)"
        if not 0 < gmu <= 1:
            out.append(violation("error", _where(ctx, role), field, f"{gmu} is outside (0, 1]", fix))
        elif gmu >= GMU_ERROR:
            out.append(violation("error", _where(ctx, role), field,
                                 f"{gmu} >= {GMU_ERROR}: no headroom for activation spikes (OOM)", fix))
        elif gmu >= GMU_WARN:
            out.append(violation("warning", _where(ctx, role), field,
                                 f"{gmu} >= {GMU_WARN}: the benchmark ceiling, tight for production", fix))
    return out


def rule_weights_fit(ctx):
    """The model's weights per NPU (models.yml, quantization, DP/TP/EP) fit HBM x gpu_memory_utilization."""
    out = []
    for role in ROLES:
        hosts = _role_hosts(ctx, role)
        try:
            problems = capacity.weights_fit_problems(ctx["cluster"], role, hosts)
        except (PdError, KeyError, TypeError):
            continue  # bad engine values are rule_engine_types' to report
        for host, message, fix in problems:
            out.append(violation("error", _where(ctx, role, host=host), "model.quantization", message, fix))
    return out


def _pinned_per_host(ctx):
    """{(role, host name): pinned bytes of one container} from specs, else the model's arithmetic."""
    pinned, problems = {}, []
    if ctx["specs"] is not None:
        for spec in ctx["specs"]:
            if spec.get("role") in ROLES and _is_int(spec.get("pinned_offload_bytes")):
                key = (spec["role"], spec.get("host"))
                pinned[key] = max(pinned.get(key, 0), spec["pinned_offload_bytes"])
        return pinned, problems
    for name, host in ctx["topo"]["hosts"].items():
        roles = {r.get("role") for r in host.get("ranks") or []} & set(ROLES)
        for role in sorted(roles):
            if ctx["roles"][role].get("cpu_offload_bytes") == 0:
                continue  # connector on without bytes: rule_offload_bytes says so, once
            try:
                pinned[(role, name)] = model.offload_bytes(ctx["cluster"], role, host)[1]
            except PdError as exc:
                problems.append(violation("error", _where(ctx, role, host=name), f"{role}.cpu_offload",
                                          exc.problem, exc.fix or "use a cpu_offload that divides over the host's ranks"))
    return pinned, problems


def _shm_fix(role, pinned):
    gib = max(16, -(-pinned * 128 // (100 * GIB)))
    return f"set {role}.shm_size to at least {gib}GiB (pinned x 1.28), or null (auto)"


def rule_shm_vs_pinned(ctx):
    """shm size (operator-set, or rendered in the spec) >= pinned offload bytes of the container."""
    pinned, out = _pinned_per_host(ctx)
    if ctx["specs"] is not None:
        for spec in ctx["specs"]:
            shm, pin = spec.get("shm_size_bytes"), spec.get("pinned_offload_bytes")
            if spec.get("role") in ROLES and _is_int(shm) and _is_int(pin) and shm < pin:
                role = spec["role"]
                out.append(violation("error", _where(ctx, role, spec.get("instance"), spec.get("host")),
                                     f"{role}.shm_size",
                                     f"shm {sizes.to_human(shm)} < {sizes.to_human(pin)} of pinned offload in "
                                     f"{spec.get('name')}: the pinned allocation fails",
                                     _shm_fix(role, pin)))
        return _dedupe(out)
    for (role, host), pin in pinned.items():
        shm = ctx["roles"][role].get("shm_size_bytes")
        if _is_int(shm) and shm < pin:
            out.append(violation("error", _where(ctx, role, host=host), f"{role}.shm_size",
                                 f"shm {sizes.to_human(shm)} < {sizes.to_human(pin)} of pinned offload per container: "
                                 "the pinned allocation fails",
                                 _shm_fix(role, pin)))
    return out


def rule_host_ram(ctx):
    """Machine RAM >= cpu_offload of every role on the machine + reserve.

    RAM belongs to the machine (``pd_machine``): a machine split into several host entries pins the
    offload of all of them in one RAM, so the roles' cpu_offload is summed over its entries.
    """
    out = []
    machines = {}
    for name, host in ctx["topo"]["hosts"].items():
        if not _is_int(host.get("ram_bytes")):
            continue
        key = ports.machine_of(ctx["topo"], name, host.get("address"))
        machines.setdefault(key, []).append((name, host))
    for machine, members in machines.items():
        ram = min(host["ram_bytes"] for _name, host in members)
        reserve = ctx["ram_reserve_bytes"]
        if reserve is None:
            found = [h.get("ram_reserve_bytes") for _name, h in members if _is_int(h.get("ram_reserve_bytes"))]
            reserve = max(found) if found else DEFAULT_RAM_RESERVE_BYTES
        offload, roles = 0, set()
        for _name, host in members:
            here = sorted({r.get("role") for r in host.get("ranks") or []} & set(ROLES))
            roles.update(here)
            for role in here:
                rcfg = ctx["roles"][role]
                if rcfg.get("offload_connector") != "none" and _is_int(rcfg.get("cpu_offload_bytes")):
                    offload += rcfg["cpu_offload_bytes"]
        roles = sorted(roles)
        name = members[0][0]
        what = "host" if len(members) == 1 else f"machine {machine} ({', '.join(n for n, _host in members)})"
        guidance = capacity.ram_guidance(offload)
        if offload and offload + reserve <= ram < guidance:
            role = roles[0] if len(roles) == 1 else None
            out.append(violation("warning", _where(ctx, role, host=name), "pd_host_ram",
                                 f"{what} RAM {sizes.to_human(ram)} is below the article's guidance for "
                                 f"{sizes.to_human(offload)} of CPU offload: {sizes.to_human(guidance)} (offload + 312GiB "
                                 "for the system and vLLM, from its 200 GB offload -> >= 512 GB RAM)",
                                 f"use a machine with >= {sizes.to_human(guidance)} of RAM, or lower cpu_offload to "
                                 f"{sizes.to_human(max(0, ram - (guidance - offload)))} on this {what.split()[0]}"))
        if offload and ram < offload + reserve:
            role = roles[0] if len(roles) == 1 else None
            out.append(violation("error", _where(ctx, role, host=name), f"{role or '/'.join(roles)}.cpu_offload",
                                 f"{what} RAM {sizes.to_human(ram)} < {sizes.to_human(offload)} pinned offload + "
                                 f"{sizes.to_human(reserve)} reserve for the system and the engines",
                                 f"lower cpu_offload to at most {sizes.to_human(max(0, ram - reserve))} on this "
                                 f"{what.split()[0]}, or use a machine with more RAM (the article pairs 200 GB offload "
                                 "with >= 512 GB RAM)"))
    return out
