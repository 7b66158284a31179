# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules on the KV transfer connectors: Mooncake between P and D, the offload connectors and where each
may run, and the --kv-transfer-config every instance really gets (rendered, then read back)."""

from ...plan import connectors, versions
from ..violation import violation
from .context import ROLES, _children, _dedupe, _instances, _is_int, _is_mooncake, _mooncake_on, _where


def rule_mooncake_connector_name(ctx):
    """The Mooncake connector name must be one the version registers (MooncakeConnectorV1, ...)."""
    row = ctx["row"]
    name = ctx["cluster"]["mooncake_connector"]
    if row is None or not _mooncake_on(ctx) or name in row["mooncake_connectors"]:
        return []
    return [violation("error", ctx["name"], "mooncake_connector",
                      f"{name!r} is not a Mooncake connector of vllm-ascend {row['line']}",
                      f"set mooncake_connector to one of: {', '.join(row['mooncake_connectors'])}")]


def rule_mooncake_both_sides(ctx):
    """P sends KV to D over Mooncake: both roles use it or neither does."""
    flags = {r: ctx["roles"][r].get("mooncake") for r in ROLES}
    if flags["prefill"] == flags["decode"]:
        return []
    off = [r for r in ROLES if flags[r] is not True][0]
    return [violation("error", _where(ctx, off), f"{off}.mooncake",
                      f"Mooncake is on for {'decode' if off == 'prefill' else 'prefill'} but off for {off}: "
                      "KV cannot travel from P to D",
                      f"set {off}.mooncake: true")]


def rule_recompute_scheduler_placement(ctx):
    """recompute_scheduler_enable only on D, and D needs a kv_consumer transfer config for it."""
    out = []
    if ctx["roles"]["prefill"].get("recompute_scheduler") is True:
        out.append(violation("error", _where(ctx, "prefill"), "prefill.recompute_scheduler",
                             "recompute_scheduler_enable is for decode nodes only; vllm-ascend refuses to start with it "
                             "on kv_both / PD-mixed nodes and ignores it on kv_producer nodes",
                             "set prefill.recompute_scheduler: false (keep it on decode)"))
    dec = ctx["roles"]["decode"]
    if dec.get("recompute_scheduler") is True and dec.get("mooncake") is not True and \
            dec.get("offload_connector") != "RecomputeCPUOffloadConnector":
        out.append(violation("error", _where(ctx, "decode"), "decode.recompute_scheduler",
                             "the recompute scheduler needs a kv_consumer --kv-transfer-config, and decode has no connector "
                             "(vllm-ascend raises ValueError)",
                             "set decode.mooncake: true, or decode.recompute_scheduler: false"))
    return out


def rule_recompute_connector_placement(ctx):
    """RecomputeCPUOffloadConnector: kv_role kv_consumer, decode only."""
    if ctx["roles"]["prefill"].get("offload_connector") != "RecomputeCPUOffloadConnector":
        return []
    return [violation("error", _where(ctx, "prefill"), "prefill.offload_connector",
                      "RecomputeCPUOffloadConnector runs as kv_consumer and only protects preempted decode requests",
                      "use offload_connector: OffloadingConnector on prefill "
                      "(RecomputeCPUOffloadConnector belongs on decode)")]


def rule_offloading_connector_placement(ctx):
    """OffloadingConnector: kv_role kv_both, prefill only (prefix paging)."""
    if ctx["roles"]["decode"].get("offload_connector") != "OffloadingConnector":
        return []
    return [violation("error", _where(ctx, "decode"), "decode.offload_connector",
                      "OffloadingConnector (kv_both, prefix paging) belongs on prefill; decode KV only grows until "
                      "a request ends",
                      "use offload_connector: RecomputeCPUOffloadConnector on decode, or none")]


def rule_offloading_usable(ctx):
    """OffloadingConnector only on rows whose spec can start (versions.yml offloading_connector)."""
    row = ctx["row"]
    if row is None or row["offloading_connector"]["usable"]:
        return []
    out = []
    lines = versions.offloading_lines()
    for role in ROLES:
        if ctx["roles"][role].get("offload_connector") != "OffloadingConnector":
            continue
        out.append(violation("error", _where(ctx, role), f"{role}.offload_connector",
                             f"OffloadingConnector cannot start on vllm-ascend {row['line']} "
                             f"(plugins/plugin_utils/data/versions.yml): {' '.join(row['offloading_connector']['reason'].split())}",
                             f"set vllm_ascend_version to a line where it works ({', '.join(lines) or 'none yet'}) "
                             f"with its image, or set {role}.offload_connector: none and {role}.cpu_offload: 0"))
    return out


def _real_parallel(ctx, side):
    """Distinct {"dp_size", "tp_size"} of the topology's instances of ``side``."""
    seen = []
    for inst in _instances(ctx, side):
        item = {"dp_size": inst.get("dp"), "tp_size": inst.get("tp")}
        if item not in seen:
            seen.append(item)
    return seen


def _check_mooncake_child(ctx, where, role, inst, child):
    out = []
    field = f"{role}.kv_transfer_config.{child.get('kv_connector')}"
    if child.get("kv_role") != connectors.ROLE_KV[role]:
        out.append(violation("error", where, f"{field}.kv_role",
                             f"kv_role {child.get('kv_role')!r} on {role}", f"render kv_role {connectors.ROLE_KV[role]!r}"))
    if str(child.get("kv_port")) != str(inst.get("kv_port")):
        out.append(violation("error", where, f"{field}.kv_port",
                             f"kv_port {child.get('kv_port')!r} differs from the instance's {inst.get('kv_port')}",
                             "render kv_port from the topology instance"))
    extra = child.get("kv_connector_extra_config") or {}
    for side in ROLES:
        real = _real_parallel(ctx, side)
        got = extra.get(side)
        if not isinstance(got, dict) or "dp_size" not in got or "tp_size" not in got:
            out.append(violation("error", where, f"{field}.{side}",
                                 f"Mooncake needs {side} dp_size and tp_size, got {got!r}",
                                 f"render {side}: {real[0] if real else {'dp_size': '..', 'tp_size': '..'}}"))
            continue
        got = {"dp_size": got["dp_size"], "tp_size": got["tp_size"]}
        if real and (len(real) > 1 or got != real[0]):
            out.append(violation("error", where, f"{field}.{side}",
                                 f"{side} {got} does not match the real {side} topology "
                                 f"{' / '.join(str(r) for r in real)}",
                                 f"render {side} dp_size/tp_size from the {side} role (one DP x TP shape per role)"))
    return out


def _check_offload_child(ctx, where, role, child):
    out = []
    kind = child.get("kv_connector")
    field = f"{role}.kv_transfer_config.{kind}"
    if kind == "RecomputeCPUOffloadConnector" and child.get("kv_role") != "kv_consumer":
        out.append(violation("error", where, f"{field}.kv_role", f"kv_role {child.get('kv_role')!r}, must be kv_consumer",
                             "render RecomputeCPUOffloadConnector with kv_role kv_consumer"))
    if kind == "OffloadingConnector":
        if child.get("kv_role") != "kv_both":
            out.append(violation("error", where, f"{field}.kv_role", f"kv_role {child.get('kv_role')!r}, must be kv_both",
                                 "render OffloadingConnector with kv_role kv_both"))
        row = ctx["row"]
        extra = child.get("kv_connector_extra_config") or {}
        if row is not None and extra.get("spec_module_path") != row["offloading_spec_module_path"]:
            out.append(violation("error", where, f"{field}.spec_module_path",
                                 f"{extra.get('spec_module_path')!r} is not where vllm-ascend {row['line']} keeps "
                                 "NPUOffloadingSpec",
                                 f"render spec_module_path {row['offloading_spec_module_path']!r} (versions.yml)"))
    return out


def _check_no_engine_id(ctx, where, role, config):
    """A rendered ``engine_id`` (top level or in a MultiConnector child) pins an id every process of
    the instance would share. A decode's Mooncake connector caches what it learnt about a prefill
    under the engine id the request names and never drops it (versions.yml ``kv_peer_cache``), so a
    prefill process started again with that id (rolling wave, rollback, recovery, scale, Docker's
    restart policy) would be pulled from at the dead process's addresses. A child's own id also
    overrides the parent's per-process one (vLLM MultiConnector). Left out, the engine makes one
    per process (docs/design.md "Engine ids are born with the process")."""
    row = ctx.get("row") or {}
    source = ((row.get("kv_peer_cache") or {}).get("sources") or ["plugins/plugin_utils/data/versions.yml"])[0]
    out = []
    children = [(f".connectors[{i}]", c) for i, c in enumerate(_children(config)) if c is not config]
    for path, holder in [("", config)] + children:
        if isinstance(holder, dict) and "engine_id" in holder:
            out.append(violation("error", where, f"{role}.kv_transfer_config{path}.engine_id",
                                 f"engine_id {holder['engine_id']!r} is fixed: a decode caches a prefill's KV "
                                 f"addresses per engine id and never drops them ({source}), so a restarted "
                                 "or replaced process with this id is pulled from at dead addresses",
                                 "render no engine_id (plugin_utils.connectors.kv_transfer_config): the engine "
                                 "gives each process its own"))
    return out


def rule_rendered_kv_transfer_config(ctx):
    """The rendered --kv-transfer-config of every instance matches the real topology and roles.

    Mooncake prefill/decode dp_size/tp_size must equal the real P and D topology, kv_role follow
    the role, kv_port the instance, and no engine_id is fixed (_check_no_engine_id); offload
    children keep their kv_role and the row's spec module. The builders derive these from the same
    data, so this catches a future bug or a hand-edited spec.
    """
    out = list(ctx["render_problems"])
    for where, role, inst, config in ctx["rendered"]:
        rcfg = ctx["roles"][role]
        kids = _children(config)
        moon = [c for c in kids if _is_mooncake(ctx, c)]
        if rcfg.get("mooncake") is True and not moon:
            out.append(violation("error", where, f"{role}.kv_transfer_config",
                                 "mooncake is on but the rendered --kv-transfer-config has no Mooncake connector",
                                 "render it with plugin_utils.connectors.kv_transfer_config"))
        if rcfg.get("mooncake") is not True and moon:
            out.append(violation("error", where, f"{role}.kv_transfer_config",
                                 "mooncake is off but the rendered --kv-transfer-config has a Mooncake connector",
                                 f"set {role}.mooncake: true or drop the connector"))
        out.extend(_check_no_engine_id(ctx, where, role, config))
        for child in moon:
            out.extend(_check_mooncake_child(ctx, where, role, inst, child))
        for child in kids:
            out.extend(_check_offload_child(ctx, where, role, child))
    return _dedupe(out)


def rule_prefill_tp_ge_decode_tp(ctx):
    """Mooncake: prefill tp_size >= decode tp_size."""
    p_tp, d_tp = ctx["roles"]["prefill"]["tp"], ctx["roles"]["decode"]["tp"]
    if not _mooncake_on(ctx) or not (_is_int(p_tp) and _is_int(d_tp)) or p_tp >= d_tp:
        return []
    return [violation("error", _where(ctx, "prefill"), "prefill.tp",
                      f"prefill tp {p_tp} < decode tp {d_tp}: Mooncake needs prefill tp_size >= decode tp_size",
                      f"raise prefill.tp to {d_tp} or more, or lower decode.tp to {p_tp}")]


def rule_block_sizes_divide(ctx):
    """Mooncake: P and D block sizes must divide each other."""
    p_bs = ctx["roles"]["prefill"]["engine"].get("block_size")
    d_bs = ctx["roles"]["decode"]["engine"].get("block_size")
    if not _mooncake_on(ctx) or not (_is_int(p_bs) and _is_int(d_bs)) or p_bs < 1 or d_bs < 1:
        return []
    if p_bs % d_bs == 0 or d_bs % p_bs == 0:
        return []
    return [violation("error", _where(ctx, "decode"), "decode.engine.block_size",
                      f"prefill block_size {p_bs} and decode block_size {d_bs} do not divide each other",
                      f"use the same block_size on both roles (e.g. {p_bs})")]
