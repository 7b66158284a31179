"""Cross-field rules of one cluster (DOMAIN.md §3-§4): every violation, all at once.

``check_cluster(cluster, topo)`` runs each rule of ``RULES`` in order on the normalized cluster and
its topology (docs/design.md) and returns the concatenated violations, each
``{level, where, field, message, fix}``. A rule never raises for a bad value: it reports it. Only
inputs of the wrong shape (not the normalized structures at all) raise ``PdError``.

Each rule is one small function ``rule(ctx) -> list`` where ``ctx`` is built once per call by
``_context`` (the cluster, its topology, the version row or the reason there is none, the rendered
connector configs). Nothing is kept between calls.
"""

import json

from ..plan import capacity, connectors, model, ports, versions
from ..shared import sizes, text
from ..shared.errors import PdError
from .violation import violation

ROLES = ("prefill", "decode")
GIB = 1024 ** 3
#: RAM kept free beside pinned offload when neither the caller nor the host record says otherwise
#: (system, the engines' own processes, page cache). The article asks >= 512 GB of RAM for 200 GB
#: of offload; pd_deploy/data/defaults.yml gives hosts 128GiB, which the host record carries.
DEFAULT_RAM_RESERVE_BYTES = 64 * GIB
#: gpu_memory_utilization: 0.85 production, 0.90 benchmark ceiling, never >= 0.95 (DOMAIN.md §4).
GMU_PRODUCTION = 0.85
GMU_WARN = 0.90
GMU_ERROR = 0.95
_V4_FAMILY_PREFIX = "deepseek_v4"


# ---------------------------------------------------------------------------------------------
# helpers


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


# ---------------------------------------------------------------------------------------------
# input shape (raises: these are programming errors, not operator values)

_CLUSTER_KEYS = ("name", "vllm_ascend_version", "model", "workload", "mooncake_connector", "proxy", "roles")
_ROLE_KEYS = ("instances", "dp", "tp", "port_base", "kv_port", "dp_rpc_port", "mooncake",
              "offload_connector", "cpu_offload_bytes", "recompute_scheduler", "shm_size_bytes", "engine")


def _check_inputs(cluster, topo, specs, ram_reserve_bytes):
    where = "pd_check_cluster"
    if not isinstance(cluster, dict):
        raise PdError(where, "cluster", f"expected the normalized cluster dict, got {type(cluster).__name__}",
                      "pass the result of pd_deploy.model.normalize()")
    if not isinstance(topo, dict):
        raise PdError(where, "topo", f"expected the topology dict, got {type(topo).__name__}",
                      "pass the topology of pd_deploy.model.topology()")
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
                      "pass the topology of pd_deploy.model.topology()")
    if specs is not None and (not isinstance(specs, list) or any(not isinstance(s, dict) for s in specs)):
        raise PdError(where, "specs", "is not a list of launch spec dicts",
                      "pass the rank specs of pd_deploy.model.rank_spec(), or nothing")
    if ram_reserve_bytes is not None and (not _is_int(ram_reserve_bytes) or ram_reserve_bytes < 0):
        raise PdError(where, "ram_reserve_bytes", f"{ram_reserve_bytes!r} is not a whole number of bytes >= 0",
                      "pass bytes (e.g. 68719476736 for 64GiB) or leave it unset")


# ---------------------------------------------------------------------------------------------
# rendered connector configs (what the engines will really get)


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
                                          "render it with pd_deploy.connectors.kv_transfer_config"))
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


# ---------------------------------------------------------------------------------------------
# rules (each returns a list of violations)


def rule_version_known(ctx):
    """vllm_ascend_version must map to a row of pd_deploy/data/versions.yml."""
    exc = ctx["row_error"]
    if exc is None:
        return []
    return [violation("error", ctx["name"], "vllm_ascend_version", exc.problem, exc.fix)]


def rule_engine_types(ctx):
    """Engine numbers the other rules compare must be numbers (they are skipped otherwise)."""
    out = []
    ints = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
            "max_num_partial_prefills", "max_long_partial_prefills")
    for role in ROLES:
        engine = ctx["roles"][role]["engine"]
        for key in ints:
            if key in engine and (not _is_int(engine[key]) or engine[key] < 1):
                out.append(violation("error", _where(ctx, role), f"{role}.engine.{key}",
                                     f"{engine[key]!r} is not a whole number >= 1",
                                     f"set {role}.engine.{key} to a whole number"))
        gmu = engine.get("gpu_memory_utilization")
        if not _is_number(gmu):
            out.append(violation("error", _where(ctx, role), f"{role}.engine.gpu_memory_utilization",
                                 f"{gmu!r} is not a number", f"set gpu_memory_utilization: {GMU_PRODUCTION} (production)"))
    for key in ("avg_prompt_tokens", "p99_prompt_tokens", "p99_output_tokens"):
        value = ctx["cluster"]["workload"].get(key)
        if not _is_int(value) or value < 1:
            out.append(violation("error", ctx["name"], f"workload.{key}", f"{value!r} is not a whole number >= 1",
                                 f"set workload.{key} to the measured token count"))
    # the ports and counts the port rules compare and the proxy parses with type=int: a float here
    # (8000.0) would be skipped by every port rule and rendered as --port 8000.0
    for role in ROLES:
        for key in ("port_base", "kv_port", "dp_rpc_port"):
            out.extend(_whole(ctx["roles"][role].get(key), _where(ctx, role), f"{role}.{key}", 1))
    proxy = ctx["cluster"]["proxy"]
    for key, minimum in (("port", 1), ("max_retries", 0), ("drain_timeout_s", 0)):
        if key in proxy:
            out.extend(_whole(proxy[key], ctx["name"], f"proxy.{key}", minimum))
    for key in ("hccl_if_base_port", "health_timeout_s"):
        if key in ctx["cluster"]:
            out.extend(_whole(ctx["cluster"][key], ctx["name"], key, 1))
    return out


def _whole(value, where, field, minimum):
    """[] for an int >= minimum, else the violation (a float such as 8000.0 named as one)."""
    if _is_int(value) and value >= minimum:
        return []
    fix = f"write {int(value)}" if isinstance(value, float) and value.is_integer() and value >= minimum \
        else f"set {field} to a whole number >= {minimum}"
    return [violation("error", where, field, f"{value!r} is not a whole number >= {minimum}", fix)]


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
                             f"(pd_deploy/data/versions.yml): {' '.join(row['offloading_connector']['reason'].split())}",
                             f"set vllm_ascend_version to a line where it works ({', '.join(lines) or 'none yet'}) "
                             f"with its image, or set {role}.offload_connector: none and {role}.cpu_offload: 0"))
    return out


def _engine_ints(engine, *keys):
    values = [engine.get(k) for k in keys]
    return values if all(_is_int(v) for v in values) else None


def rule_decode_batched_tokens(ctx):
    """Decode max_num_batched_tokens = max_num_seqs x (1 + speculative tokens), as upstream sizes D."""
    engine = ctx["roles"]["decode"]["engine"]
    values = _engine_ints(engine, "max_num_batched_tokens", "max_num_seqs", "num_speculative_tokens")
    if values is None:
        return []
    tokens, seqs, spec = values
    need = seqs * (1 + spec)
    if tokens == need:
        return []
    field = "decode.engine.max_num_batched_tokens"
    fix = (f"set decode.engine.max_num_batched_tokens: {need} (max_num_seqs {seqs} x (1 + {spec})), "
           "or null to derive it")
    if tokens < need:
        return [violation("error", _where(ctx, "decode"), field,
                          f"{tokens} < max_num_seqs x (1 + num_speculative_tokens) = {need}: one decode step of every "
                          "running request with its draft tokens does not fit, so decode cannot run max_num_seqs at once",
                          fix)]
    return [violation("warning", _where(ctx, "decode"), field,
                      f"{tokens} > max_num_seqs x (1 + num_speculative_tokens) = {need}: upstream sizes decode exactly "
                      "(tutorial A2 D 30 x 2 = 60, nightly D 60 x 4 = 240); the surplus only reserves activation memory",
                      fix)]


#: vllm-ascend sets the largest captured ACL graph to min(max_num_seqs x (1 + draft tokens), 512) when
#: no capture size is given (v0.23.0 .. main: vllm_ascend/platform.py _get_default_max_cudagraph_capture_size),
#: so pd-deploy renders no capture sizes; past the cap decode steps are not captured.
GRAPH_CAPTURE_CAP = 512


def rule_decode_graph_capture(ctx):
    """Decode graphs cover max_num_seqs x (1 + N) tokens only up to vllm-ascend's 512 cap."""
    engine = ctx["roles"]["decode"]["engine"]
    values = _engine_ints(engine, "max_num_seqs", "num_speculative_tokens")
    if values is None or not engine.get("cudagraph_mode") or engine.get("enforce_eager"):
        return []
    need = values[0] * (1 + values[1])
    if need <= GRAPH_CAPTURE_CAP:
        return []
    return [violation("warning", _where(ctx, "decode"), "decode.engine.max_num_seqs",
                      f"max_num_seqs x (1 + num_speculative_tokens) = {need} > {GRAPH_CAPTURE_CAP}: vllm-ascend captures "
                      f"decode graphs up to {GRAPH_CAPTURE_CAP} tokens, so full decode batches run without "
                      f"{engine['cudagraph_mode']} graphs",
                      f"keep max_num_seqs x (1 + num_speculative_tokens) <= {GRAPH_CAPTURE_CAP}, or add more decode DP ranks")]


def rule_speculative_agree(ctx):
    """P and D both use speculative decoding (same method) or neither; P drafts 1 token for MTP."""
    out = []
    method = ctx["cluster"].get("recipe", {}).get("speculative_method")
    n = {r: ctx["roles"][r]["engine"].get("num_speculative_tokens") for r in ROLES}
    if not all(_is_int(v) and v >= 0 for v in n.values()):
        for role in ROLES:
            if not (_is_int(n[role]) and n[role] >= 0):
                out.append(violation("error", _where(ctx, role), f"{role}.engine.num_speculative_tokens",
                                     f"{n[role]!r} is not a whole number >= 0", "set num_speculative_tokens: 1 (MTP) or 0"))
        return out
    if (n["prefill"] > 0) != (n["decode"] > 0):
        off = "prefill" if n["prefill"] == 0 else "decode"
        out.append(violation("error", _where(ctx, off), f"{off}.engine.num_speculative_tokens",
                             f"speculative decoding is on for {'decode' if off == 'prefill' else 'prefill'} but off for "
                             f"{off}: P and D must run the same speculative method, the Mooncake connector transfers the "
                             "draft (MTP) layer's KV only when both sides have it",
                             f"set {off}.engine.num_speculative_tokens: 1 (or 0 on both)"))
    if (n["prefill"] or n["decode"]) and not method:
        out.append(violation("error", ctx["name"], "recipe.speculative_method",
                             "num_speculative_tokens > 0 but the model family has no speculative method",
                             "set pd_cluster.recipe.speculative_method (mtp), or num_speculative_tokens: 0"))
    if method == "mtp" and n["prefill"] > 1:
        out.append(violation("warning", _where(ctx, "prefill"), "prefill.engine.num_speculative_tokens",
                             f"{n['prefill']} MTP tokens on prefill: P generates one token, upstream drafts 1 there "
                             "(DeepSeek-V4-Flash tutorial: 'Prefill to 1 and Decode to the actual number')",
                             "set prefill.engine.num_speculative_tokens: 1"))
    return out


def rule_recipe_flags(ctx):
    """--enable-auto-tool-choice needs a --tool-call-parser (vLLM refuses to start without one)."""
    recipe = ctx["cluster"].get("recipe") or {}
    if recipe.get("enable_auto_tool_choice") and not recipe.get("tool_call_parser"):
        return [violation("error", ctx["name"], "recipe.enable_auto_tool_choice",
                          "auto tool choice is on without a tool call parser: vLLM refuses to start",
                          "set pd_cluster.recipe.tool_call_parser (deepseek_v4), or enable_auto_tool_choice: false")]
    return []


#: the image repository whose tags the version table knows (quay.io, vllm-ascend's release images)
OFFICIAL_IMAGE = "quay.io/ascend/vllm-ascend"
A3_NPUS = 16
A3_SUFFIX = "-a3"
#: npu-smi's Name column on an Atlas A3 (its dies show "Ascend910", A2's "910B3"; prechecks compare it
#: with pd_npu_chip): an entry naming this chip is on an A3 machine, whatever NPUs it lists
A3_CHIPS = ("ascend910",)


def _split_image(image):
    """``(repository, tag)``; tag None when the reference has none (a registry port is not a tag)."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, None
    return name, tag


def machine_npus(hosts):
    """{machine: NPUs the machine has at least}, from its host entries however they split it.

    A machine (``pd_machine``, default the host's address) has at least as many NPUs as the highest
    device number any of its entries uses: two 8-NPU entries at pd_npu_first 0 and 8 are one 16-NPU
    machine, and so is one 8-NPU entry at pd_npu_first 8. Image variants (the -a3 tag) and every other
    fact of the hardware follow the machine, never one host entry.
    """
    out = {}
    for host in hosts:
        npus, first = host.get("npus"), host.get("npu_first") or 0
        if not (_is_int(npus) and _is_int(first)):
            continue
        machine = str(host.get("machine") or host.get("address") or host.get("name"))
        out[machine] = max(out.get(machine, 0), first + npus)
    return out


def rule_image_tag(ctx):
    """The official image's tag must be the version row's (plus -a3 on 16-NPU A3 machines).

    vllm-ascend builds two images per release from two Dockerfiles (main: Dockerfile for A2/910B,
    Dockerfile.a3 for A3), published as <tag> and <tag>-a3: the variant is the machine's SoC, so a
    16-NPU machine listed as two 8-NPU hosts still runs the -a3 image (``machine_npus``).
    """
    row, image = ctx["row"], ctx["cluster"].get("image")
    if row is None or not isinstance(image, str):
        return []
    repo, tag = _split_image(image)
    if repo != OFFICIAL_IMAGE:
        return []
    hosts = list(ctx["topo"]["hosts"].values())
    a3 = sorted(set(m for m, n in machine_npus(hosts).items() if n >= A3_NPUS) | {
        str(h.get("machine") or h.get("address") or h.get("name")) for h in hosts
        if str(h.get("npu_chip") or "").strip().lower() in A3_CHIPS})
    suffix = A3_SUFFIX if a3 else ""
    kind = (f"machine(s) {', '.join(a3)} have {A3_NPUS} NPUs: A3 machines run the -a3 image, however the "
            "inventory splits them into hosts" if a3 else "A2 machines (8 NPUs) run the image without -a3")
    if row["image_tag"] is None:
        return [violation("warning", ctx["name"], "image",
                          f"vllm-ascend {row['line']} has no published image tag in pd_deploy/data/versions.yml: "
                          f"{image} must have been built and loaded on every host",
                          "build the image from that branch, or use a line with a published image")]
    want = row["image_tag"] + suffix
    if tag == want:
        return []
    return [violation("error", ctx["name"], "image",
                      f"{image} is not vllm-ascend {row['line']}'s image: its published tag is {want} ({kind}; "
                      f"pd_deploy/data/versions.yml image_tag)",
                      f"set image: {OFFICIAL_IMAGE}:{want}, or vllm_ascend_version to the line of the tag you run")]


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


def rule_batched_tokens_vs_prompt(ctx):
    """Prefill max_num_batched_tokens >= 2 x average prompt (two prompts prefill per step)."""
    engine = ctx["roles"]["prefill"]["engine"]
    value, avg = engine.get("max_num_batched_tokens"), ctx["cluster"]["workload"].get("avg_prompt_tokens")
    if not (_is_int(value) and _is_int(avg)) or value < 1 or avg < 1 or value >= 2 * avg:
        return []
    rec = capacity.recommend_batched_tokens(avg, tp=ctx["roles"]["prefill"]["tp"]
                                            if _is_int(ctx["roles"]["prefill"]["tp"]) else 4)
    return [violation("warning", _where(ctx, "prefill"), "prefill.engine.max_num_batched_tokens",
                      f"{value} < 2 x average prompt ({2 * avg}): fewer than two prompts prefill per step "
                      "(symptom: 'max-num-seqs=32 but only 1 request running')",
                      f"set max_num_batched_tokens: {rec['recommended']} ({rec['rule']})")]


def rule_batched_tokens_danger(ctx):
    """max_num_batched_tokens in the article's danger zone (65536): activation memory OOM.

    The article (§4.2, 910B3 64 GB TP4): 32768 sweet spot, 49152 upper bound, "65536 is the danger
    zone". Above 65536 at TP <= 4: error; 65536 itself, or above it at a larger TP (not measured
    there): warning.
    """
    out = []
    for role in ROLES:
        rcfg = ctx["roles"][role]
        value, tp = rcfg["engine"].get("max_num_batched_tokens"), rcfg["tp"]
        if not (_is_int(value) and _is_int(tp)) or value < capacity.DANGER_ZONE:
            continue
        error = tp <= 4 and value > capacity.DANGER_ZONE
        where_tp = f"at TP{tp}" if tp <= 4 else f"at TP{tp} (the article measured TP4; not proven safe here)"
        out.append(violation("error" if error else "warning", _where(ctx, role), f"{role}.engine.max_num_batched_tokens",
                             f"{value} >= {capacity.DANGER_ZONE} {where_tp}: the article's danger zone on 910B3 "
                             "(activation memory OOM)",
                             f"set max_num_batched_tokens: {capacity.SWEET_SPOT} (sweet spot) or at most "
                             f"{capacity.UPPER_BOUND} (upper bound)"))
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


def rule_retention_interval(ctx):
    """prefix_cache_retention_interval: a non-negative multiple of block_size, ideally 128 x block."""
    out = []
    for role in ROLES:
        engine = ctx["roles"][role]["engine"]
        interval, block = engine.get("prefix_cache_retention_interval"), engine.get("block_size")
        if interval is None or not _is_int(block) or block < 1:
            continue
        field = f"{role}.engine.prefix_cache_retention_interval"
        want = capacity.RETENTION_BLOCKS * block
        if not _is_int(interval) or interval < 0 or interval % block:
            out.append(violation("error", _where(ctx, role), field,
                                 f"{interval!r} is not a non-negative multiple of block_size {block}",
                                 f"set prefix_cache_retention_interval: {want} (128 x block_size)"))
        elif interval != want:
            out.append(violation("warning", _where(ctx, role), field,
                                 f"{interval} != 128 x block_size ({want})",
                                 f"set prefix_cache_retention_interval: {want} (block 32 -> 4096, 128 -> 16384)"))
    return out


def rule_hybrid_kv_manager(ctx):
    """--disable-hybrid-kv-cache-manager breaks DeepSeek-V4 KV compression (error)."""
    family = str(ctx["cluster"]["model"].get("family") or "")
    if not family.startswith(_V4_FAMILY_PREFIX):
        return []
    out = []
    for role in ROLES:
        engine = ctx["roles"][role]["engine"]
        extra = [str(a) for a in (engine.get("extra_args") or [])]
        via = None
        if engine.get("disable_hybrid_kv_cache_manager") is True:
            via = "disable_hybrid_kv_cache_manager"
        elif "--disable-hybrid-kv-cache-manager" in extra:
            via = "extra_args"
        if via:
            out.append(violation("error", _where(ctx, role), f"{role}.engine.{via}",
                                 f"the hybrid KV cache manager is disabled for {family}: KV compression stops and KV "
                                 "grows many times",
                                 "set disable_hybrid_kv_cache_manager: false and drop --disable-hybrid-kv-cache-manager "
                                 "(--no-disable-hybrid-kv-cache-manager must stay)"))
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
    source = ((row.get("kv_peer_cache") or {}).get("sources") or ["pd_deploy/data/versions.yml"])[0]
    out = []
    for path, holder in [("", config)] + [(f".connectors[{i}]", c) for i, c in enumerate(_children(config))
                                             if c is not config]:
        if isinstance(holder, dict) and "engine_id" in holder:
            out.append(violation("error", where, f"{role}.kv_transfer_config{path}.engine_id",
                                 f"engine_id {holder['engine_id']!r} is fixed: a decode caches a prefill's KV "
                                 f"addresses per engine id and never drops them ({source}), so a restarted "
                                 "or replaced process with this id is pulled from at dead addresses",
                                 "render no engine_id (pd_deploy.connectors.kv_transfer_config): the engine "
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
                                 "render it with pd_deploy.connectors.kv_transfer_config"))
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
        for o_addr, o_lo, o_hi, o_role, o_index, _ in claims[:i]:
            if addr == o_addr and _overlap(lo, hi, o_lo, o_hi) and (role, index) != (o_role, o_index):
                out.append(violation("error", _where(ctx, role, index, host), f"{role}.kv_port",
                                     f"kv ports {lo}..{hi - 1} overlap {o_role} instance {o_index}'s {o_lo}..{o_hi - 1} "
                                     f"on {addr}",
                                     f"move {role}.kv_port to {o_hi} or above (each instance takes dp x tp ports)"))
    return out


def rule_port_windows(ctx):
    """Ports vs the windows Mooncake and HCCL draw from, per host address (pd_deploy/ports.py).

    kv ports strictly above Mooncake's Ascend transport window (sized by the image's Mooncake
    version and the ranks' device ids), rendered ports outside every window, one HCCL window per
    instance on a shared host, nothing past 65535.
    """
    try:
        return ports.check(ports.claims(ctx["cluster"], ctx["topo"], ctx["row"]))
    except PdError as exc:
        return [violation("error", exc.where, exc.field, exc.problem, exc.fix or "see pd_deploy/data/ports.yml")]


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
        ram = min(host["ram_bytes"] for _, host in members)
        reserve = ctx["ram_reserve_bytes"]
        if reserve is None:
            found = [h.get("ram_reserve_bytes") for _, h in members if _is_int(h.get("ram_reserve_bytes"))]
            reserve = max(found) if found else DEFAULT_RAM_RESERVE_BYTES
        offload, roles = 0, set()
        for _, host in members:
            here = sorted({r.get("role") for r in host.get("ranks") or []} & set(ROLES))
            roles.update(here)
            for role in here:
                rcfg = ctx["roles"][role]
                if rcfg.get("offload_connector") != "none" and _is_int(rcfg.get("cpu_offload_bytes")):
                    offload += rcfg["cpu_offload_bytes"]
        roles = sorted(roles)
        name = members[0][0]
        what = "host" if len(members) == 1 else f"machine {machine} ({', '.join(n for n, _ in members)})"
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


def rule_max_model_len(ctx):
    """max_model_len >= p99 prompt + p99 output, or the longest requests are refused."""
    work = ctx["cluster"]["workload"]
    prompt, output = work.get("p99_prompt_tokens"), work.get("p99_output_tokens")
    if not (_is_int(prompt) and _is_int(output)):
        return []
    need = prompt + output
    out = []
    for role in ROLES:
        value = ctx["roles"][role]["engine"].get("max_model_len")
        if _is_int(value) and value < need:
            out.append(violation("error", _where(ctx, role), f"{role}.engine.max_model_len",
                                 f"{value} < p99 prompt + p99 output ({prompt} + {output} = {need}): requests at the p99 "
                                 "are refused",
                                 f"set max_model_len: {need} (the business P99, not the model maximum)"))
    return out


def rule_partial_prefills(ctx):
    """max_num/long_partial_prefills above the version's maximum (1): refused or reset to 1."""
    row = ctx["row"]
    if row is None:
        return []
    out = []
    refuse = row["partial_prefills_over_max"] == "refuse"
    for role in ROLES:
        engine = ctx["roles"][role]["engine"]
        for key, limit in (("max_num_partial_prefills", row["max_num_partial_prefills_max"]),
                           ("max_long_partial_prefills", row["max_long_partial_prefills_max"])):
            value = engine.get(key)
            if not _is_int(value) or value <= limit:
                continue
            if refuse:
                level = "error"
                message = (f"{value} > {limit}: vLLM {row['vllm_version']} refuses to start "
                           "(NotImplementedError: Concurrent Partial Prefill is not supported); vllm-ascend's "
                           "reset to 1 never runs, so the article's head-of-line fix is unavailable here")
            else:
                level = "warning"
                message = (f"{value} > {limit}: vllm-ascend {row['line']} resets it to 1 with a warning, "
                           "so the setting is a no-op on Ascend")
            out.append(violation(level, _where(ctx, role), f"{role}.engine.{key}", message,
                                 f"set {key}: {limit}; for short prompts stuck behind long ones lower "
                                 "long_prefill_token_threshold / max_num_batched_tokens instead"))
    return out


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
        for o_addr, o_port, o_label, _, _ in claims[:i]:
            if addr == o_addr and port == o_port:
                out.append(violation("error", where, field, f"port {port} of {label} is also used by {o_label} on {addr}",
                                     "give each role distinct port_base / dp_rpc_port ranges and the proxy its own port"))
        for k_addr, lo, hi, k_role, k_index, _ in _kv_claims(ctx):
            if addr == k_addr and lo <= port < hi:
                out.append(violation("error", where, field,
                                     f"port {port} of {label} lies in {k_role} instance {k_index}'s kv ports "
                                     f"{lo}..{hi - 1} on {addr}",
                                     "move port_base / dp_rpc_port / proxy.port away from the kv_port ranges"))
    return out


#: The rules, run in this order by check_cluster.
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


RULES = (
    rule_version_known,
    rule_engine_types,
    rule_mooncake_connector_name,
    rule_mooncake_both_sides,
    rule_recompute_scheduler_placement,
    rule_recompute_connector_placement,
    rule_offloading_connector_placement,
    rule_offloading_usable,
    rule_offload_bytes,
    rule_gpu_memory_utilization,
    rule_batched_tokens_vs_prompt,
    rule_batched_tokens_danger,
    rule_retention_interval,
    rule_hybrid_kv_manager,
    rule_rendered_kv_transfer_config,
    rule_prefill_tp_ge_decode_tp,
    rule_block_sizes_divide,
    rule_kv_port_ranges,
    rule_port_windows,
    rule_shm_vs_pinned,
    rule_host_ram,
    rule_weights_fit,
    rule_max_model_len,
    rule_decode_batched_tokens,
    rule_decode_graph_capture,
    rule_speculative_agree,
    rule_recipe_flags,
    rule_image_tag,
    rule_partial_prefills,
    rule_drain_timing,
    rule_topology_fit,
    rule_ports_unique,
)


# ---------------------------------------------------------------------------------------------
# public API


def check_cluster(cluster, topo, specs=None, ram_reserve_bytes=None):
    """Return every violation of one normalized cluster and its topology (list of dicts).

    ``specs`` (optional) are the cluster's rank launch specs; when given, the connector configs,
    shm and pinned bytes are checked as rendered there, otherwise they are rendered here from the
    same builders. ``ram_reserve_bytes`` is the RAM kept free beside pinned offload on every host;
    None uses each host record's ``ram_reserve_bytes`` and else 64GiB (DEFAULT_RAM_RESERVE_BYTES).
    Raises PdError only when the inputs are not the normalized structures at all.
    """
    _check_inputs(cluster, topo, specs, ram_reserve_bytes)
    ctx = _context(cluster, topo, specs, ram_reserve_bytes)
    out = []
    for rule in RULES:
        out.extend(rule(ctx))
    return out


def format_violation(v):
    """One line for a violation: ``ERROR cluster_a/prefill: field: what is wrong — what to do``."""
    where = "pd_format_violation"
    if not isinstance(v, dict):
        raise PdError(where, "violation", f"expected a violation dict, got {type(v).__name__}",
                      "pass one item of pd_check_cluster's result")
    missing = [k for k in ("level", "where", "field", "message") if k not in v]
    if missing:
        raise PdError(where, "violation", f"missing key(s) {', '.join(missing)}",
                      "pass one item of pd_check_cluster's result")
    # names as pd_deploy.text.shown prints them (b-d1\u200b), no invisible character anywhere
    line = f"{str(v['level']).upper()} {text.shown(v['where'])}: {text.shown(v['field'])}: {text.visible(v['message'])}"
    if v.get("fix"):
        line += f" — {text.visible(v['fix'])}"
    return line


def has_errors(vs):
    """True when any violation of ``vs`` has level "error" (errors block the deploy)."""
    if not isinstance(vs, list):
        raise PdError("pd_has_errors", "violations", f"expected a list, got {type(vs).__name__}",
                      "pass the list pd_check_cluster returns")
    return any(isinstance(v, dict) and v.get("level") == "error" for v in vs)


FILTERS = {
    "pd_check_cluster": check_cluster,
    "pd_format_violation": format_violation,
}
