# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules on what the release allows: the version row, the image tag, engine value types, recipe flags
and the DeepSeek-V4 KV manager."""

from ..violation import violation
from .context import ROLES, _is_int, _is_number, _where
from .memory import GMU_PRODUCTION

_V4_FAMILY_PREFIX = "deepseek_v4"


def rule_version_known(ctx):
    """vllm_ascend_version must map to a row of plugins/plugin_utils/data/versions.yml."""
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
    name, _sep, tag = image.rpartition(":")
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
                          f"vllm-ascend {row['line']} has no published image tag in plugins/plugin_utils/data/versions.yml: "
                          f"{image} must have been built and loaded on every host",
                          "build the image from that branch, or use a line with a published image")]
    want = row["image_tag"] + suffix
    if tag == want:
        return []
    return [violation("error", ctx["name"], "image",
                      f"{image} is not vllm-ascend {row['line']}'s image: its published tag is {want} ({kind}; "
                      f"plugins/plugin_utils/data/versions.yml image_tag)",
                      f"set image: {OFFICIAL_IMAGE}:{want}, or vllm_ascend_version to the line of the tag you run")]


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
