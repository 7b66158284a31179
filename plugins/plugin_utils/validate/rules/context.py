# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every rule of the package reads: the per-call context and the helpers the rules share.

``_context`` makes it once per ``check_cluster`` call: the cluster, its topology, the version row (or
the reason there is none) and the rendered connector configs. ``_check_inputs`` refuses
inputs that are not the normalized structures at all (programming errors, raised as ``PdError``).
The underscore names are private to ``plugin_utils.validate.rules``; its modules import them.
"""

import json

from ...plan import connectors, model, ports, versions
from ...shared.errors import PdError
from ..violation import violation

ROLES = ("prefill", "decode")
GIB = 1024 ** 3


def _where(ctx, role=None, instance=None, host=None):
    """``<cluster>/<role>[/instance i][@host]``."""
    return ports.where_label(ctx["name"], role, instance, host)


_is_int = ports.is_int


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dedupe(items):
    """Drop repeated violations (ranks of one instance on one host report once)."""
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _mooncake_on(ctx):
    return any(ctx["roles"][r].get("mooncake") is True for r in ROLES)


def _instances(ctx, role=None):
    return [i for i in ctx["topo"]["instances"] if role is None or i.get("role") == role]


def _role_hosts(ctx, role):
    return [h for h in ctx["topo"]["hosts"].values() if h.get("role") == role]


def _overlap(a_lo, a_hi, b_lo, b_hi):
    """Half-open ranges [lo, hi) overlap."""
    return a_lo < b_hi and b_lo < a_hi


_CLUSTER_KEYS = ("name", "vllm_ascend_version", "model", "workload", "mooncake_connector", "proxy", "roles")
_ROLE_KEYS = ("instances", "dp", "tp", "port_base", "kv_port", "dp_rpc_port", "mooncake",
              "offload_connector", "cpu_offload_bytes", "recompute_scheduler", "shm_size_bytes", "engine")


def _check_inputs(cluster, topo, specs, ram_reserve_bytes):
    where = "pd_check_cluster"
    if not isinstance(cluster, dict):
        raise PdError(where, "cluster", f"expected the normalized cluster dict, got {type(cluster).__name__}",
                      "pass the result of plugin_utils.model.normalize()")
    if not isinstance(topo, dict):
        raise PdError(where, "topo", f"expected the topology dict, got {type(topo).__name__}",
                      "pass the topology of plugin_utils.model.topology()")
    missing = [k for k in _CLUSTER_KEYS if k not in cluster]
    if missing:
        raise PdError(where, "cluster", f"missing key(s) {', '.join(missing)}",
                      "pass the normalized cluster (docs/design.md), not the raw pd_cluster")
    roles = cluster["roles"]
    if not isinstance(roles, dict) or any(not isinstance(roles.get(r), dict) for r in ROLES):
        raise PdError(where, "cluster.roles", "needs a 'prefill' and a 'decode' mapping",
                      "pass the normalized cluster (docs/design.md)")
    for role in ROLES:
        missing = [k for k in _ROLE_KEYS if k not in roles[role]]
        if missing:
            raise PdError(where, f"cluster.roles.{role}", f"missing key(s) {', '.join(missing)}",
                          "pass the normalized cluster (docs/design.md)")
        if not isinstance(roles[role]["engine"], dict):
            raise PdError(where, f"cluster.roles.{role}.engine", "is not a mapping",
                          "pass the normalized cluster (docs/design.md)")
    for key in ("model", "workload", "proxy"):
        if not isinstance(cluster[key], dict):
            raise PdError(where, f"cluster.{key}", "is not a mapping", "pass the normalized cluster (docs/design.md)")
    if not isinstance(topo.get("instances"), list) or not isinstance(topo.get("hosts"), dict):
        raise PdError(where, "topo", "needs 'instances' (list) and 'hosts' (mapping)",
                      "pass the topology of plugin_utils.model.topology()")
    if specs is not None and (not isinstance(specs, list) or any(not isinstance(s, dict) for s in specs)):
        raise PdError(where, "specs", "is not a list of launch spec dicts",
                      "pass the rank specs of plugin_utils.model.rank_spec(), or nothing")
    if ram_reserve_bytes is not None and (not _is_int(ram_reserve_bytes) or ram_reserve_bytes < 0):
        raise PdError(where, "ram_reserve_bytes", f"{ram_reserve_bytes!r} is not a whole number of bytes >= 0",
                      "pass bytes (e.g. 68719476736 for 64GiB) or leave it unset")


def _command_json(command, flag):
    """The JSON value following ``flag`` in an argv list; None when absent. Raises ValueError."""
    if not isinstance(command, list) or flag not in command:
        return None
    index = command.index(flag)
    if index + 1 >= len(command):
        raise ValueError(f"{flag} has no value")
    return json.loads(command[index + 1])


def _find_instance(ctx, role, index):
    for inst in _instances(ctx, role):
        if inst.get("index") == index:
            return inst
    return None


def _rendered(ctx):
    """Return ``(items, problems)``; items are ``(where, role, instance, kv_transfer_config)``.

    With launch specs the configs are read back from each rank's argv (exactly what will run);
    without, each instance is rendered with ``connectors.kv_transfer_config``. A config that cannot
    be rendered or parsed becomes a problem violation.
    """
    items, problems = [], []
    row = ctx["row"]
    if ctx["specs"] is not None:
        for spec in ctx["specs"]:
            role = spec.get("role")
            if role not in ROLES:
                continue
            inst = _find_instance(ctx, role, spec.get("instance"))
            where = _where(ctx, role, spec.get("instance"), spec.get("host"))
            if inst is None:
                problems.append(violation("error", where, f"{role}.instances",
                                          f"launch spec {spec.get('name')!r} names an instance the topology lacks",
                                          "render the launch specs from this topology"))
                continue
            try:
                items.append((where, role, inst, _command_json(spec.get("command"), "--kv-transfer-config")))
            except ValueError as exc:
                problems.append(violation("error", where, f"{role}.kv_transfer_config",
                                          f"the rendered --kv-transfer-config is not valid JSON ({exc})",
                                          "render it with plugin_utils.connectors.kv_transfer_config"))
        return items, problems
    if row is None:
        return items, problems
    for inst in _instances(ctx):
        role = inst.get("role")
        if role not in ROLES:
            continue
        rcfg = ctx["roles"][role]
        where = _where(ctx, role, inst.get("index"))
        per_container = None
        ranks = inst.get("ranks") or []
        host = ctx["topo"]["hosts"].get(ranks[0].get("host")) if ranks else None
        try:
            per_container = model.offload_bytes(ctx["cluster"], role, host)[0] if host is not None else None
        except PdError:
            pass  # the split is reported by rule_shm_vs_pinned
        if per_container is None and rcfg.get("offload_connector") != "none":
            # bytes missing or not splittable (reported by rule_offload_bytes / rule_shm_vs_pinned):
            # render with a stand-in so the connector shape is still checked
            per_container = 1
        try:
            items.append((where, role, inst,
                          connectors.kv_transfer_config(rcfg, ctx["cluster"], inst, row, per_container)))
        except PdError as exc:
            problems.append(violation("error", where, exc.field, exc.problem, exc.fix or "see the field's documentation"))
    return items, problems


def _is_mooncake(ctx, child):
    """A Mooncake child: the configured name, a name the row knows, or any Mooncake* connector."""
    name = str(child.get("kv_connector", ""))
    known = ctx["row"]["mooncake_connectors"] if ctx["row"] else []
    return name == ctx["cluster"]["mooncake_connector"] or name in known or name.startswith("Mooncake")


def _children(config):
    if not isinstance(config, dict):
        return []
    if config.get("kv_connector") == "MultiConnector":
        kids = (config.get("kv_connector_extra_config") or {}).get("connectors") or []
        return [c for c in kids if isinstance(c, dict)]
    return [config]


def _context(cluster, topo, specs, ram_reserve_bytes):
    ctx = {"cluster": cluster, "topo": topo, "specs": specs, "name": cluster["name"],
           "roles": cluster["roles"], "ram_reserve_bytes": ram_reserve_bytes, "row": None, "row_error": None}
    try:
        ctx["row"] = versions.version_row(cluster["vllm_ascend_version"])
    except PdError as exc:
        ctx["row_error"] = exc
    ctx["rendered"], ctx["render_problems"] = _rendered(ctx)
    return ctx
