# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The inventory model: operator intent -> normalized clusters -> topology (launch specs: launch.py).

Prefill and decode are the same shape; only their data differ. Nothing here talks to a host: the
functions take plain dicts (see docs/design.md) and return plain dicts, so the whole fleet can be
planned, checked and rendered on the controller before anything is touched.
"""

import copy
import math

from ..shared import datafiles, sizes
from ..shared.errors import PdError
from ..validate.violation import error, violation
from . import ports

ROLES = ("prefill", "decode")
GIB = 1024 ** 3
# shm headroom over the container's pinned offload: the article's 200 GB -> --shm-size=256g
SHM_HEADROOM = 1.28
SHM_MIN_BYTES = 16 * GIB
# Ascend device nodes every rank needs besides its davinciN (DOMAIN.md §2)
ASCEND_CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
# Read-only driver mounts (DOMAIN.md §2); the source is prefixed with the host's ascend_root
ASCEND_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
    "/etc/hccn.conf",
    "/usr/local/Ascend/driver/tools/hccn_tool",
)


#: recipe items of a model family set per cluster (pd_cluster.recipe); string items take false = off
RECIPE_CLUSTER_KEYS = ("tokenizer_mode", "tool_call_parser", "enable_auto_tool_choice", "reasoning_parser",
                       "enable_expert_parallel", "quantization", "speculative_method", "allocator_preload")
_RECIPE_STRINGS = ("tokenizer_mode", "tool_call_parser", "reasoning_parser", "quantization",
                   "speculative_method", "allocator_preload")
#: recipe items of a model family set per role (pd_cluster.<role>.engine)
RECIPE_ROLE_KEYS = ("enforce_eager", "num_speculative_tokens", "speculative_enforce_eager", "cudagraph_mode",
                    "additional_config")


def family_recipe(family, where="pd_family_recipe"):
    """A fresh copy of the launch recipe of a model family (plugins/plugin_utils/data/models.yml ``recipe``)."""
    data = datafiles.yaml_data("models.yml")
    if not isinstance(family, str) or not isinstance(data.get(family), dict) or "recipe" not in data[family]:
        known = ", ".join(sorted(k for k, v in data.items() if isinstance(v, dict) and "recipe" in v))
        raise PdError(where, "model.family", f"{family!r} is not a model family with a recipe",
                      f"set pd_cluster.model.family to one of: {known}")
    return data[family]["recipe"]


def _resolve_recipe(cluster):
    """Fill the cluster's recipe items the operator left null from its model family."""
    fam = family_recipe(cluster["model"].get("family"), cluster["name"])
    if cluster.get("mooncake_connector") is None:
        cluster["mooncake_connector"] = fam["mooncake_connector"]
    own = cluster.get("recipe") or {}
    resolved = {}
    for key in RECIPE_CLUSTER_KEYS:
        value = own.get(key)
        value = fam[key] if value is None else value
        if key in _RECIPE_STRINGS and value is False:
            value = None
        resolved[key] = value
    resolved["env"] = dict(fam.get("env") or {})
    cluster["recipe"] = resolved
    return fam


def _resolve_role_recipe(merged, fam_role):
    """Fill a role's recipe items left null from the family; decode batched tokens from seqs x (1 + N)."""
    engine = merged["engine"]
    for key in RECIPE_ROLE_KEYS:
        if engine.get(key) is None:
            engine[key] = copy.deepcopy(fam_role[key])
    if engine["cudagraph_mode"] is False:
        engine["cudagraph_mode"] = None
    seqs, spec = engine.get("max_num_seqs"), engine.get("num_speculative_tokens")
    if engine.get("max_num_batched_tokens") is None and all(
            isinstance(v, int) and not isinstance(v, bool) for v in (seqs, spec)):
        engine["max_num_batched_tokens"] = seqs * (1 + spec)
    merged["env"] = dict(fam_role.get("env") or {}, **(merged.get("env") or {}))


def defaults():
    """Return a fresh copy of plugins/plugin_utils/data/defaults.yml (callers may mutate it)."""
    return datafiles.yaml_data("defaults.yml")


def deep_merge(base, override):
    """Return ``base`` with ``override`` merged in (dicts recursively, anything else replaced).

    Neither argument is modified.
    """
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _where(name, role=None):
    return f"{name}/{role}" if role else name


def _require_int(value, where, field, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PdError(where, field, f"{value!r} is not a whole number >= {minimum}",
                      f"set {field} to a whole number >= {minimum}")
    return value


def normalize_cluster(name, raw):
    """Merge defaults under one cluster's ``pd_cluster`` dict and convert sizes to bytes.

    Returns the normalized cluster of docs/design.md. Raises PdError for values that cannot be
    interpreted at all (shape errors are the JSON Schema's job and are reported before this runs).
    """
    if not isinstance(name, str) or not name:
        raise PdError("pd_normalize_cluster", "name", f"{name!r} is not a cluster name",
                      "give every cluster group_vars a pd_cluster.name equal to its group name")
    if not isinstance(raw, dict):
        raise PdError(name, "pd_cluster", f"expected a mapping, got {type(raw).__name__}",
                      f"define pd_cluster as a dict in group_vars/{name}.yml")
    base = defaults()
    raw = {k: v for k, v in raw.items() if k not in ROLES}
    cluster = deep_merge(base["cluster"], raw)
    cluster["name"] = name
    for key in ("vllm_ascend_version", "image"):
        if not cluster.get(key):
            raise PdError(name, key, "is required", f"set pd_cluster.{key} in group_vars/{name}.yml")
    if not (cluster.get("model") or {}).get("path"):
        raise PdError(name, "model.path", "is required",
                      f"set pd_cluster.model.path (the model directory on every host) in group_vars/{name}.yml")
    cluster["vllm_ascend_version"] = str(cluster["vllm_ascend_version"])
    _resolve_recipe(cluster)
    return cluster


def normalize(name, raw):
    """Full normalization of one cluster: cluster keys plus both roles (sizes as bytes)."""
    cluster = normalize_cluster(name, raw)
    base = defaults()
    fam = family_recipe(cluster["model"]["family"], name)
    cluster["roles"] = {}
    for role in ROLES:
        override = (raw or {}).get(role) or {}
        if not isinstance(override, dict):
            raise PdError(name, role, f"expected a mapping, got {type(override).__name__}",
                          f"write pd_cluster.{role} as a dict of role keys")
        merged = deep_merge(deep_merge(base["role_common"], base[role]), override)
        where = _where(name, role)
        merged["role"] = role
        merged["cpu_offload_bytes"] = sizes.to_bytes(
            merged.pop("cpu_offload"), field=f"{role}.cpu_offload", where=where)
        shm = merged.pop("shm_size")
        merged["shm_size_bytes"] = None if shm is None else sizes.to_bytes(
            shm, field=f"{role}.shm_size", where=where)
        for key in ("instances", "dp", "tp"):
            _require_int(merged[key], where, f"{role}.{key}", minimum=1)
        _resolve_role_recipe(merged, fam[role])
        cluster["roles"][role] = merged
    cluster["env_common"] = dict(base["env_common"], **cluster["recipe"]["env"])
    return cluster


def host_record(name, role, hostvars_subset):
    """Build the host record of docs/design.md from a host's pd_* variables (plain dict).

    The IP address (pd_host_address / ansible_host), pd_hccl_if and pd_host_ram have no default
    (plugins/plugin_utils/inventory.py): a missing one raises PdError naming the host and the field.
    """
    from ..validate import inventory  # local: inventory reads the roles, model stays importable alone

    base = defaults()["host"]
    hv = hostvars_subset or {}
    where = name

    def pick(key, default):
        value = hv.get(key)
        return default if value is None else value

    def need(key):
        if hv.get(key) is None:
            raise PdError(where, key, "missing (no default)", f"set {key} in the host's host_vars")
        return hv[key]

    npus = _require_int(pick("pd_npus", base["npus"]), where, "pd_npus", minimum=1)
    npu_first = _require_int(pick("pd_npu_first", base["npu_first"]), where, "pd_npu_first")
    address = inventory.host_address(name, hv)
    return {
        "name": name,
        "role": role,
        "address": address,
        "machine": str(pick("pd_machine", address)),
        "npus": npus,
        "npu_first": npu_first,
        "hbm_per_npu_bytes": sizes.to_bytes(pick("pd_hbm_per_npu", base["hbm_per_npu"]),
                                            field="pd_hbm_per_npu", where=where),
        "npu_chip": str(pick("pd_npu_chip", base["npu_chip"])),
        "ram_bytes": sizes.to_bytes(need("pd_host_ram"), field="pd_host_ram", where=where),
        "ram_reserve_bytes": sizes.to_bytes(pick("pd_host_ram_reserve", base["ram_reserve"]),
                                            field="pd_host_ram_reserve", where=where),
        "hccl_if": str(need("pd_hccl_if")),
        "ascend_root": str(pick("pd_ascend_root", base["ascend_root"])).rstrip("/"),
        # the one default of the Docker socket (plugins/plugin_utils/data/variables.yml); roles read it from the plan
        "docker_socket": str(pick("pd_docker_socket", inventory.shared_default("pd_docker_socket"))),
    }


def host_npus(host):
    """The host's NPU numbers pd-deploy may use: ``npu_first .. npu_first + npus - 1``."""
    return list(range(host["npu_first"], host["npu_first"] + host["npus"]))


def topology(cluster, hosts):
    """Place every DP rank of every instance on hosts; return (topology, problems).

    Ranks fill the role's hosts in inventory order, ``npus // tp`` ranks per host. An instance may
    span hosts. Problems (not enough NPUs, tp not dividing a host) are returned as violation dicts
    instead of raised, so that they are reported together with every other rule.
    """
    name = cluster["name"]
    problems = []
    topo = {"instances": [], "hosts": {h["name"]: dict(h, ranks=[]) for h in hosts}}
    for role in ROLES:
        rcfg = cluster["roles"][role]
        dp, tp, count = rcfg["dp"], rcfg["tp"], rcfg["instances"]
        role_hosts = [h for h in hosts if h["role"] == role]
        slots = []  # (host, first device) in fill order
        for host in role_hosts:
            if host["npus"] % tp:
                problems.append(error(
                    f"{name}/{role}@{host['name']}", f"{role}.tp",
                    f"tp {tp} does not divide the host's {host['npus']} NPUs",
                    "choose tp that divides pd_npus (4 or 8 on an 8-NPU host)"))
            for slot in range(host["npus"] // tp):
                slots.append((host, host["npu_first"] + slot * tp))
        needed = count * dp
        if needed > len(slots):
            problems.append(error(
                f"{name}/{role}", f"{role}.instances",
                f"{count} instance(s) of DP{dp} x TP{tp} need {needed * tp} NPUs but the {role} hosts "
                f"({', '.join(h['name'] for h in role_hosts) or 'none'}) have {len(slots) * tp} usable",
                f"add hosts to the '{role}' group of {name} or lower {role}.instances / dp"))
        elif needed < len(slots):
            problems.append(violation(
                "warning", f"{name}/{role}", f"{role}.instances",
                f"{len(slots) - needed} DP slot(s) of TP{tp} on the {role} hosts stay unused",
                "raise instances or dp, or remove the spare host from the group"))
        for index in range(count):
            inst = {
                "role": role, "index": index, "dp": dp, "tp": tp,
                "kv_port": rcfg["kv_port"] + index * dp * tp,
                "dp_rpc_port": rcfg["dp_rpc_port"] + index,
                "hosts": [], "ranks": [],
            }
            for dp_rank in range(dp):
                pos = index * dp + dp_rank
                if pos >= len(slots):
                    break
                host, first = slots[pos]
                rank = {
                    "role": role, "instance": index, "dp_rank": dp_rank, "host": host["name"],
                    "address": host["address"], "devices": list(range(first, first + tp)),
                    "port": rcfg["port_base"] + index * dp + dp_rank,
                    "container": f"pd-{name}-{role}{index}-dp{dp_rank}",
                }
                inst["ranks"].append(rank)
                if host["name"] not in inst["hosts"]:
                    inst["hosts"].append(host["name"])
                topo["hosts"][host["name"]]["ranks"].append(rank)
            inst["dp_address"] = inst["ranks"][0]["address"] if inst["ranks"] else None
            topo["instances"].append(inst)
    _hccl_slots(topo)
    return topo, problems


def _hccl_slots(topo):
    """Number the instances on each machine 0, 1, ..: each gets its own HCCL window (host networking:
    the machine's ports, however many host entries or addresses the inventory gives it)."""
    seen = {}
    spaces = ports.port_spaces((n, h.get("machine"), h.get("address")) for n, h in topo["hosts"].items())
    for inst in topo["instances"]:
        for rank in inst["ranks"]:
            owners = seen.setdefault(spaces.get(rank["host"], str(rank["address"])), [])
            if (inst["role"], inst["index"]) not in owners:
                owners.append((inst["role"], inst["index"]))
            rank["hccl_slot"] = owners.index((inst["role"], inst["index"]))


def role_topology(cluster, role):
    """Return ``{"dp_size": .., "tp_size": ..}`` of a role, as Mooncake's extra config wants it."""
    rcfg = cluster["roles"][role]
    return {"dp_size": rcfg["dp"], "tp_size": rcfg["tp"]}


def offload_bytes(cluster, role, host):
    """Bytes the role's offload connector gets per container on ``host``, and pinned bytes.

    Returns ``(connector_value, pinned_bytes_per_container)`` or ``(None, 0)`` without offload.
    ``cpu_offload`` is the pinned CPU memory of one instance (all of its DP x TP ranks), so a
    container's value depends only on its role's settings: adding or removing an instance (elastic
    scale) never changes another instance's launch spec, and a host pins the sum of the instances'
    shares it runs (the RAM rule adds them up). RecomputeCPUOffloadConnector takes bytes per NPU rank
    (cpu_offload / (dp x tp)); OffloadingConnector takes bytes per engine (cpu_offload / dp: each
    external-DP rank is an engine). See docs/design.md "Offload arithmetic".
    """
    rcfg = cluster["roles"][role]
    kind = rcfg["offload_connector"]
    total = rcfg["cpu_offload_bytes"]
    if kind == "none":
        return None, 0
    where = f"{cluster['name']}/{role}@{host['name']}"
    field = f"{role}.cpu_offload"  # errors name the inventory field, never the connector's key
    if not total:
        raise PdError(where, field, f"{kind} is on but cpu_offload is 0",
                      f"set {field} (e.g. 200GiB per instance) or {role}.offload_connector: none")
    if kind == "RecomputeCPUOffloadConnector":
        per_rank = _split_offload(total, rcfg["dp"] * rcfg["tp"], "NPUs of an instance (dp x tp)", where, field)
        return per_rank, per_rank * rcfg["tp"]
    per_engine = _split_offload(total, rcfg["dp"], "engines of an instance (dp)", where, field)
    return per_engine, per_engine


def _split_offload(total, parts, what, where, field):
    """``total`` bytes over ``parts`` exactly, or PdError naming the inventory field and totals that divide."""
    share, rest = divmod(total, parts)
    if rest:
        down, up = total - rest, total - rest + parts
        raise PdError(where, field, f"{sizes.to_human(total)} ({total} bytes) does not divide over the {parts} "
                      f"{what} (remainder {rest} bytes)",
                      f"set {field} to a multiple of {parts} bytes, e.g. {sizes.to_human(down) if down else '0'} "
                      f"or {sizes.to_human(up)} ({up} bytes)")
    return share


def shm_bytes(rcfg, pinned):
    """shm size of a container: the operator's value, else pinned x 1.28 rounded up to GiB."""
    if rcfg["shm_size_bytes"] is not None:
        return rcfg["shm_size_bytes"]
    return max(SHM_MIN_BYTES, math.ceil(pinned * SHM_HEADROOM / GIB) * GIB)
