# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Builders of the engine's ``--kv-transfer-config`` and ``--additional-config`` dicts.

Every builder returns a new plain dict (the caller serialises it with compact JSON) and never
modifies its arguments. Version-dependent keys come from a ``versions.version_row()`` row, never
from constants here (DOMAIN.md §3). Connector placement rules (Recompute only on decode, ...) are
not enforced by the builders: ``rules.check_cluster`` reports them, all at once, before anything
is rendered for a host.
"""

import copy

from ..shared.errors import PdError

ROLE_KV = {"prefill": "kv_producer", "decode": "kv_consumer"}
OFFLOAD_CONNECTORS = ("none", "OffloadingConnector", "RecomputeCPUOffloadConnector")


def _check_dict(value, where, field):
    if not isinstance(value, dict):
        raise PdError(where, field, f"expected a mapping, got {type(value).__name__}",
                      f"pass the normalized {field} dict (docs/design.md)")
    return value


def _check_int(value, where, field, minimum=1, maximum=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise PdError(where, field, f"{value!r} is not a whole number {bound}",
                      f"set {field} to a whole number {bound}")
    return value


def _check_str(value, where, field):
    if not isinstance(value, str) or not value:
        raise PdError(where, field, f"{value!r} is not a non-empty string", f"set {field} to a name")
    return value


def _check_role(role_name, where, field="role"):
    if role_name not in ROLE_KV:
        raise PdError(where, field, f"{role_name!r} is neither 'prefill' nor 'decode'",
                      "use the role names prefill or decode")
    return role_name


def _parallel(topo, where, field):
    """``{"dp_size", "tp_size"}`` from a role/instance dict (dp, tp) or a Mooncake-style dict."""
    _check_dict(topo, where, field)
    dp = topo["dp_size"] if "dp_size" in topo else topo.get("dp")
    tp = topo["tp_size"] if "tp_size" in topo else topo.get("tp")
    return {"dp_size": _check_int(dp, where, f"{field}.dp"),
            "tp_size": _check_int(tp, where, f"{field}.tp")}


def _check_row(row, where):
    _check_dict(row, where, "row")
    for key in ("offloading_spec_name", "offloading_spec_module_path", "recompute_scheduler_key"):
        _check_str(row.get(key), where, f"row.{key}")
    return row


def mooncake_child(role_name, connector_name, kv_port, prefill_topo, decode_topo):
    """The Mooncake P2P child of one instance: producer on prefill, consumer on decode.

    ``kv_port`` is the instance's first port (an int; rendered as a string like the article and
    the vllm-ascend guides). ``prefill_topo`` / ``decode_topo`` are dicts with ``dp``/``tp`` (a
    normalized role or a topology instance) or ``dp_size``/``tp_size``; Mooncake requires both and
    they must be the real P and D topology.
    """
    where = "pd_mooncake_child"
    _check_role(role_name, where, "role_name")
    _check_str(connector_name, where, "connector_name")
    _check_int(kv_port, where, "kv_port", minimum=1, maximum=65535)
    return {
        "kv_connector": connector_name,
        "kv_role": ROLE_KV[role_name],
        "kv_port": str(kv_port),
        "kv_connector_extra_config": {
            "prefill": _parallel(prefill_topo, where, "prefill_topo"),
            "decode": _parallel(decode_topo, where, "decode_topo"),
        },
    }


def offloading_child(cpu_bytes_to_use, row, blocks_per_chunk=8):
    """OffloadingConnector child (prefix paging to host RAM, kv_both, prefill side).

    ``cpu_bytes_to_use`` is the pool of one engine in bytes; spec name and module path come from
    the version row (the module moved on vllm-ascend main).
    """
    where = "pd_offloading_child"
    _check_int(cpu_bytes_to_use, where, "cpu_bytes_to_use")
    _check_row(row, where)
    _check_int(blocks_per_chunk, where, "blocks_per_chunk")
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": cpu_bytes_to_use,
            "blocks_per_chunk": blocks_per_chunk,
            "spec_name": row["offloading_spec_name"],
            "spec_module_path": row["offloading_spec_module_path"],
        },
    }


def recompute_child(cpu_bytes_to_use_per_rank, tp=None):
    """RecomputeCPUOffloadConnector child (keeps preempted requests' KV in RAM; decode only).

    With ``tp`` (the engine's TP size = vLLM's world_size of one external-DP rank) the server-wide
    ``cpu_bytes_to_use`` = per rank x tp is rendered next to ``cpu_bytes_to_use_per_rank``: the
    connector divides ``cpu_bytes_to_use`` (default 8 GiB) by world_size and warns at start when the
    per-rank value differs from that quotient (vllm-ascend main:vllm_ascend/distributed/kv_transfer/
    kv_pool/recompute_cpu_offload/recompute_cpu_offload_connector.py L55-L69, same at v0.23.0).
    """
    where = "pd_recompute_child"
    _check_int(cpu_bytes_to_use_per_rank, where, "cpu_bytes_to_use_per_rank")
    extra = {}
    if tp is not None:
        extra["cpu_bytes_to_use"] = cpu_bytes_to_use_per_rank * _check_int(tp, where, "tp")
    extra["cpu_bytes_to_use_per_rank"] = cpu_bytes_to_use_per_rank
    return {
        "kv_connector": "RecomputeCPUOffloadConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": extra,
    }


#: the sub-keys of ``<role>.kv_connector_engine`` (see apply_engine_names)
ENGINE_NAME_KEYS = ("names", "extra_config", "multi")


def apply_engine_names(children, engine_map, role, where="pd_kv_transfer_config"):
    """Map the rendered children to an engine that names its connectors differently.

    ``engine_map`` is the role's ``kv_connector_engine`` (None = the rendered children as they are):
    ``names`` {product connector name: the engine's class name}, ``extra_config`` {product connector
    name: keys added to that child's kv_connector_extra_config}, ``multi`` (wrap even one child in
    MultiConnector). Children are matched by the name the product renders; a name no child has, or
    an extra key the renderer already sets for that child, is refused (the renderer owns those).
    Returns ``(children, multi)``; ``children`` are new dicts.
    """
    field = f"{role}.kv_connector_engine"
    if engine_map is None:
        return children, False
    _check_dict(engine_map, where, field)
    unknown = sorted(set(engine_map) - set(ENGINE_NAME_KEYS))
    if unknown:
        raise PdError(where, f"{field}.{unknown[0]}", "is not a key of kv_connector_engine",
                      f"use only {', '.join(ENGINE_NAME_KEYS)}")
    names = _check_dict(engine_map.get("names") or {}, where, f"{field}.names")
    extras = _check_dict(engine_map.get("extra_config") or {}, where, f"{field}.extra_config")
    multi = engine_map.get("multi", False)
    if not isinstance(multi, bool):
        raise PdError(where, f"{field}.multi", f"{multi!r} is not true or false",
                      "set multi: true to wrap even a single child in MultiConnector")
    rendered = [c["kv_connector"] for c in children]
    for key, mapping in (("names", names), ("extra_config", extras)):
        for name in mapping:
            if name not in rendered:
                raise PdError(where, f"{field}.{key}.{name}",
                              f"no connector named {name!r} is rendered for {role} "
                              f"(rendered: {', '.join(rendered) or 'none'})",
                              "key it by a connector name the role renders (mooncake_connector or offload_connector)")
    out = []
    for child in children:
        child = copy.deepcopy(child)
        name = child["kv_connector"]
        extra = _check_dict(extras.get(name) or {}, where, f"{field}.extra_config.{name}")
        owned = sorted(set(extra) & set(child["kv_connector_extra_config"]))
        if owned:
            raise PdError(where, f"{field}.extra_config.{name}.{owned[0]}",
                          "is a key the renderer sets for this connector",
                          "remove it: only keys the renderer does not own may be added")
        child["kv_connector_extra_config"].update(copy.deepcopy(extra))
        if name in names:
            child["kv_connector"] = _check_str(names[name], where, f"{field}.names.{name}")
        out.append(child)
    return out, multi


def kv_transfer_config(role_cfg, cluster, instance, row, offload_bytes):
    """The whole ``--kv-transfer-config`` dict of one instance, or None without any connector.

    Children in order [Mooncake, offload] (MultiConnector loads from the first child that has the
    tokens, so the transfer connector comes first). Two children -> ``MultiConnector`` with the
    role's kv_role (kv_producer on prefill, kv_consumer on decode); one child -> that child's dict.
    No ``engine_id`` anywhere: the engine gives each process its own (docs/design.md "Engine ids are
    born with the process"), so a decode never reuses what it cached about a prefill process that
    was replaced (a fixed id would be one cache entry for every process that ever held it).
    ``offload_bytes`` is the offload child's value for one container: ``cpu_bytes_to_use`` for OffloadingConnector, ``cpu_bytes_to_use_per_rank``
    for RecomputeCPUOffloadConnector; ignored (may be None) when the role has no offload connector.
    The role's ``kv_connector_engine`` (apply_engine_names; null by default) maps the children to an
    engine whose connector names differ (the test inventory of molecule/real-engine: vLLM's CPU build).
    """
    where = "pd_kv_transfer_config"
    _check_dict(role_cfg, where, "role_cfg")
    _check_dict(cluster, where, "cluster")
    _check_dict(instance, where, "instance")
    role = _check_role(role_cfg.get("role"), where, "role_cfg.role")
    if instance.get("role") != role:
        raise PdError(where, "instance.role",
                      f"instance role {instance.get('role')!r} differs from role_cfg role {role!r}",
                      "pass the instance together with its own role's config")
    offload = role_cfg.get("offload_connector")
    if offload not in OFFLOAD_CONNECTORS:
        raise PdError(where, f"{role}.offload_connector", f"{offload!r} is not one of "
                      f"{', '.join(OFFLOAD_CONNECTORS)}", "choose one of those connector names")
    mooncake = role_cfg.get("mooncake")
    if not isinstance(mooncake, bool):
        raise PdError(where, f"{role}.mooncake", f"{mooncake!r} is not true or false",
                      "set mooncake: true (P/D transfer) or false")
    _check_row(row, where)
    children = []
    if mooncake:
        roles = _check_dict(cluster.get("roles"), where, "cluster.roles")
        children.append(mooncake_child(role, cluster.get("mooncake_connector"), instance.get("kv_port"),
                                       roles.get("prefill"), roles.get("decode")))
    if offload == "OffloadingConnector":
        children.append(offloading_child(offload_bytes, row))
    elif offload == "RecomputeCPUOffloadConnector":
        children.append(recompute_child(offload_bytes, role_cfg.get("tp")))
    if not children:
        return None
    children, multi = apply_engine_names(children, role_cfg.get("kv_connector_engine"), role,
                                         f"{cluster.get('name')}/{role}")
    if len(children) == 1 and not multi:
        return children[0]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": ROLE_KV[role],
        "kv_connector_extra_config": {"connectors": children},
    }


def additional_config(role_cfg, row, extra=None):
    """``--additional-config`` dict of a role, or None when it needs none.

    ``extra`` (a dict, from the model family's recipe or the cluster's engine.additional_config)
    comes first: Ascend options such as ``enable_cpu_binding``. Then ``recompute_scheduler_enable:
    true`` when the role asks for the recompute scheduler, at the top level (row key "top",
    v0.23/v0.24: the nested form is silently ignored there) or under ``scheduler_config`` (row key
    "nested", from v0.25.1rc1).
    """
    where = "pd_additional_config"
    _check_dict(role_cfg, where, "role_cfg")
    _check_row(row, where)
    if extra is not None:
        _check_dict(extra, where, "additional_config")
    out = copy.deepcopy(extra or {})
    enabled = role_cfg.get("recompute_scheduler")
    if not isinstance(enabled, bool):
        raise PdError(where, "recompute_scheduler", f"{enabled!r} is not true or false",
                      "set recompute_scheduler: true (decode only) or false")
    if enabled:
        key = row["recompute_scheduler_key"]
        if key == "top":
            out["recompute_scheduler_enable"] = True
        elif key == "nested":
            out.setdefault("scheduler_config", {})["recompute_scheduler_enable"] = True
        else:
            raise PdError(where, "row.recompute_scheduler_key", f"{key!r} is neither 'top' nor 'nested'",
                          "fix the row in plugins/plugin_utils/data/versions.yml")
    return out or None
