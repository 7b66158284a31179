# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Capacity arithmetic from the article (DOMAIN.md §4, §5): KV budget, token budgets, concurrency.

All functions are pure; sizes accept human strings (``"64GiB"``) through ``plugin_utils.sizes``.
Ratios such as ``gpu_memory_utilization`` are taken at their decimal value (0.85 is 17/20), and
byte and token results are rounded down, so the figures are exact and repeatable.
"""

from fractions import Fraction

from ..shared import datafiles
from ..shared.errors import PdError
from ..shared.sizes import check_int, check_number, to_bytes, to_human

#: max-num-batched-tokens levels measured on 910B3 (64 GB per NPU) at TP4 (article §4.2).
SWEET_SPOT = 32768
UPPER_BOUND = 49152
DANGER_ZONE = 65536

#: The article's starting value for max-num-seqs (per DP group), raised while KV usage stays < 0.7.
START_MAX_NUM_SEQS = 32

#: The article's "KV cache takes ~60% of the budget" (§3.4): a rule of thumb that assumes the weights
#: fit; used only for model families without weights data in plugins/plugin_utils/data/models.yml.
ARTICLE_KV_SHARE = 0.6

#: VLLM_PREFIX_CACHE_RETENTION_INTERVAL = this x block size (article: block 32 -> 4096).
RETENTION_BLOCKS = 128

#: Step used to round a recommended max-num-batched-tokens up (the article's values are multiples).
_BATCH_STEP = 8192

#: The article's table, 910B3 TP4: (largest average prompt, low, high) of max-num-batched-tokens.
_BATCH_TABLE = (
    (4096, 16384, 16384),
    (8192, 16384, 24576),
    (16384, 32768, 32768),
    (32768, 49152, 65536),
)


def kv_budget(hbm_per_device, devices, gpu_memory_utilization, kv_share=ARTICLE_KV_SHARE, dp=1):
    """The article's rule of thumb for the KV cache bytes of one host and of each of its DP groups.

    It assumes weights that fit and a fixed 60% share; planning uses ``role_kv_budget`` (from the
    model's weights) and keeps this only for families without weights data.

    host = HBM per device x devices x gpu_memory_utilization x kv_share (the part of vLLM's budget
    left for KV after weights and activations); per DP group = host / dp. Article: 8 x 64GiB
    (512 GB) x 0.85 x 0.6 ~= 261 GB per host, ~130 GB per group with DP2.

    Returns ``{host_bytes, per_dp_group_bytes, hbm_total_bytes}`` (ints, rounded down).
    ``gpu_memory_utilization`` and ``kv_share`` must be in (0, 1]; ``devices`` and ``dp`` positive
    ints with ``dp`` dividing ``devices``.
    """
    where = "pd_kv_budget"
    hbm = to_bytes(hbm_per_device, field="hbm_per_device", where=where)
    check_int(devices, "devices", where, minimum=1)
    util = check_number(gpu_memory_utilization, "gpu_memory_utilization", where, low=0, high=1, low_open=True)
    share = check_number(kv_share, "kv_share", where, low=0, high=1, low_open=True)
    check_int(dp, "dp", where, minimum=1)
    if devices % dp:
        raise PdError(
            where,
            "dp",
            f"{dp} DP groups do not divide {devices} devices",
            "use a dp that divides the device count (e.g. 8 devices: dp 1, 2, 4 or 8)",
        )
    if hbm == 0:
        raise PdError(where, "hbm_per_device", "0 bytes of HBM", 'give the HBM of one device, e.g. "64GiB"')
    hbm_total = hbm * devices
    host_exact = hbm_total * util * share
    return {
        "host_bytes": int(host_exact),
        "per_dp_group_bytes": int(host_exact / dp),
        "hbm_total_bytes": hbm_total,
    }


def kv_tokens(kv_bytes, bytes_per_token):
    """Return how many tokens of KV fit in ``kv_bytes``: floor(kv_bytes / bytes_per_token).

    ``kv_bytes`` is a size; ``bytes_per_token`` a positive number (it may be fractional, as the
    start-up log gives it).
    """
    where = "pd_kv_tokens"
    size = to_bytes(kv_bytes, field="kv_bytes", where=where)
    per_token = check_number(bytes_per_token, "bytes_per_token", where, low=0, low_open=True)
    return int(Fraction(size) / per_token)


def batched_tokens_level(value, tp=4):
    """Classify a prefill ``max-num-batched-tokens`` against the article's 910B3 safety line.

    ``"ok"`` up to the sweet spot (32768); ``"upper"`` above it and below 65536 (49152 is the upper
    bound the article recommends); ``"danger"`` from 65536 on: the article calls 65536 itself the
    danger zone ("65536 是危险区", activation memory OOM). The thresholds were measured at TP4 and are
    applied unchanged for other ``tp`` values: treat them as a starting point there.
    """
    where = "pd_batched_tokens_level"
    check_int(value, "max_num_batched_tokens", where, minimum=1)
    check_int(tp, "tp", where, minimum=1)
    if value <= SWEET_SPOT:
        return "ok"
    if value < DANGER_ZONE:
        return "upper"
    return "danger"


def _round_up(value, step):
    """Smallest multiple of ``step`` that is >= ``value``."""
    return -(-value // step) * step


def recommend_batched_tokens(avg_prompt_tokens, tp=4):
    """Recommend a prefill ``max-num-batched-tokens`` for an average prompt length.

    Uses the article's table (910B3, TP4): avg <= 4096 -> 16384; <= 8192 -> 16384..24576;
    <= 16384 -> 32768; <= 32768 -> 49152..65536. Inside a band the value is
    max(band low, 2 x avg rounded up to a multiple of 8192), capped at the band high, so it is
    always >= 2 x avg (at least two prompts prefill per step). Above 32768 no safe value exists
    on TP4: the result is 2 x avg rounded up with level ``"error"``. At avg 32768 the rule gives 65536,
    the article's own table row and its danger zone at once: the level says ``"danger"``.

    Returns ``{recommended, low, high, rule, level}``; ``level`` is ``batched_tokens_level`` of the
    recommendation, or ``"error"`` beyond the table.
    """
    where = "pd_recommend_batched_tokens"
    check_int(avg_prompt_tokens, "avg_prompt_tokens", where, minimum=1)
    check_int(tp, "tp", where, minimum=1)
    need = 2 * avg_prompt_tokens
    tp_note = "" if tp == 4 else f"; the table was measured at TP4, treat it as a starting point for TP{tp}"
    for limit, low, high in _BATCH_TABLE:
        if avg_prompt_tokens <= limit:
            recommended = min(high, max(low, _round_up(need, _BATCH_STEP)))
            band = f"{low}" if low == high else f"{low}..{high}"
            rule = (
                f"910B3 TP4 table: average prompt <= {limit} tokens -> {band}; "
                f"keep >= 2 x average prompt ({need}){tp_note}"
            )
            return {
                "recommended": recommended,
                "low": low,
                "high": high,
                "rule": rule,
                "level": batched_tokens_level(recommended, tp),
            }
    recommended = _round_up(need, _BATCH_STEP)
    rule = (
        f"average prompt {avg_prompt_tokens} tokens is beyond the 910B3 TP4 table (<= 32768): "
        f"2 x average = {need} needs {recommended}, past the {DANGER_ZONE} danger zone (activation OOM); "
        f"shorten prompts, lower the workload's average, or measure a larger TP before using it{tp_note}"
    )
    return {"recommended": recommended, "low": recommended, "high": recommended, "rule": rule, "level": "error"}


def expected_p_concurrency(max_num_seqs, dp, max_num_batched_tokens, avg_prompt_tokens):
    """Expected number of prompts a prefill instance runs at once (article §4.2).

    Both limits are per DP group (article §3.4: "max-num-seqs and max-num-batched-tokens are both
    per-DP-group limits; total concurrency = per DP group x DP size"): each DP rank is its own engine
    with its own scheduler and token budget. So per DP group = max(1, min(max_num_seqs, fit)) with
    fit = max_num_batched_tokens // avg prompt, and per instance = that x dp. fit < 1 means every
    prompt is chunked over several steps and only one runs per group while the rest wait
    ("max-num-seqs=32 but only 1 running": a 16K prompt cannot fit 8192); fit < 2 breaks the
    ">= 2 x average prompt" rule.

    Returns ``{concurrency, concurrency_per_dp_group, fit, seq_cap, limited_by, chunked, level,
    message}``: ``concurrency`` is per instance, ``fit`` per DP group and step, ``seq_cap`` =
    max_num_seqs x dp; ``level`` is ``"ok"`` or ``"warning"``.
    """
    where = "pd_expected_p_concurrency"
    check_int(max_num_seqs, "max_num_seqs", where, minimum=1)
    check_int(dp, "dp", where, minimum=1)
    check_int(max_num_batched_tokens, "max_num_batched_tokens", where, minimum=1)
    check_int(avg_prompt_tokens, "avg_prompt_tokens", where, minimum=1)
    seq_cap = max_num_seqs * dp
    fit = max_num_batched_tokens // avg_prompt_tokens
    per_group = max(1, min(max_num_seqs, fit))
    concurrency = per_group * dp
    limited_by = "max_num_seqs" if max_num_seqs <= fit else "max_num_batched_tokens"
    chunked = fit < 1
    if chunked:
        message = (
            f"an average prompt of {avg_prompt_tokens} tokens does not fit max-num-batched-tokens "
            f"{max_num_batched_tokens}: prompts are chunked and only 1 runs per DP group while the rest wait; "
            f"raise max-num-batched-tokens to >= {2 * avg_prompt_tokens}"
        )
    elif fit < 2:
        message = (
            f"max-num-batched-tokens {max_num_batched_tokens} fits only {fit} average prompt "
            f"({avg_prompt_tokens} tokens) per step of a DP group; raise it to >= {2 * avg_prompt_tokens}"
        )
    else:
        message = (f"{per_group} prompts per step per DP group, {concurrency} per instance of DP{dp} "
                   f"(limited by {limited_by})")
    return {
        "concurrency": concurrency,
        "concurrency_per_dp_group": per_group,
        "fit": fit,
        "seq_cap": seq_cap,
        "limited_by": limited_by,
        "chunked": chunked,
        "level": "warning" if fit < 2 else "ok",
        "message": message,
    }


def recommend_max_num_seqs(kv_tokens_per_dp_group, longest_prompt_tokens):
    """Upper estimate of ``max-num-seqs`` per DP group: KV tokens of the group // longest prompt.

    Always at least 1. This is the KV ceiling; the article starts at ``START_MAX_NUM_SEQS`` (32)
    and raises it (48, 64) only while ``vllm:kv_cache_usage_perc`` stays below 0.7.
    """
    where = "pd_recommend_max_num_seqs"
    check_int(kv_tokens_per_dp_group, "kv_tokens_per_dp_group", where, minimum=0)
    check_int(longest_prompt_tokens, "longest_prompt_tokens", where, minimum=1)
    return max(1, kv_tokens_per_dp_group // longest_prompt_tokens)


def retention_interval(block_size):
    """``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` for a block size: 128 x block (32 -> 4096, 128 -> 16384)."""
    check_int(block_size, "block_size", "pd_retention_interval", minimum=1)
    return RETENTION_BLOCKS * block_size


def d_batched_tokens(max_num_seqs, num_speculative_tokens=0):
    """Decode ``max-num-batched-tokens``: max_num_seqs x (1 + speculative tokens) (DOMAIN §4).

    A decode step schedules one token per running request plus its speculative tokens, so D
    needs no more than this (the article's D uses a small value, 144).
    """
    where = "pd_d_batched_tokens"
    check_int(max_num_seqs, "max_num_seqs", where, minimum=1)
    check_int(num_speculative_tokens, "num_speculative_tokens", where, minimum=0)
    return max_num_seqs * (1 + num_speculative_tokens)


# --- KV budget from the model's weights (issue 10 finding 5) -------------------------------------

#: The article's host RAM guidance (§5.4): 200 GB of CPU offload wants >= 512 GB of host RAM
#: ("200GB offload + system + vLLM base"); the article's GB are binary (200 GB = 200 x 1024^3 bytes).
RAM_GUIDANCE_OFFLOAD = 200 * 1024 ** 3
RAM_GUIDANCE_RAM = 512 * 1024 ** 3


def _mapping(value, field, where):
    if not isinstance(value, dict):
        raise PdError(where, field, f"expected a mapping, got {type(value).__name__}",
                      f"give {field} as in plugins/plugin_utils/data/models.yml")
    return value


def _entry(table, key, table_field, field, where, fix):
    """The mapping ``table[key]`` of a data table, or a PdError naming ``field`` and the keys it takes."""
    table = _mapping(table, table_field, where)
    if key not in table:
        raise PdError(where, field, f"{key!r} is not one of {', '.join(sorted(table))}", fix)
    return _mapping(table[key], f"{table_field}.{key}", where)


def weights_per_npu(weights, quantization, tp, dp=1, expert_parallel=True):
    """Estimated weight bytes one NPU of a DP x TP instance holds.

    ``weights`` is a model family's ``weights`` entry of plugins/plugin_utils/data/models.yml
    (``n_routed_experts``, ``expert_params``, ``dense_params``, ``quantizations``). The dense part
    is TP-sharded: dense_params x dense_bits / 8 / tp. Routed experts: with expert parallel the EP
    group is the DP x TP ranks of the instance and each rank holds ceil(n_routed_experts / ep) of
    them (vllm-ascend splits n_routed_experts // ep_size per rank); without it they are TP-sharded
    like the dense part. Results are rounded up: this is a lower bound on what must fit.

    Returns ``{total_bytes, expert_bytes, dense_bytes, ep_size, experts_per_npu, quantization}``
    (``ep_size`` 1 and ``experts_per_npu`` None without expert parallel).
    """
    where = "pd_weights_per_npu"
    weights = _mapping(weights, "weights", where)
    bits = _entry(weights.get("quantizations"), quantization, "weights.quantizations", "quantization", where,
                  "set pd_cluster.model.quantization to a scheme the family's weights data lists")
    check_int(tp, "tp", where, minimum=1)
    check_int(dp, "dp", where, minimum=1)
    experts = check_int(weights.get("n_routed_experts"), "weights.n_routed_experts", where, minimum=1)
    expert_params = check_int(weights.get("expert_params"), "weights.expert_params", where, minimum=0)
    dense_params = check_int(weights.get("dense_params"), "weights.dense_params", where, minimum=0)
    expert_bits = check_int(bits.get("expert_bits"), f"weights.quantizations.{quantization}.expert_bits", where,
                            minimum=1)
    dense_bits = check_int(bits.get("dense_bits"), f"weights.quantizations.{quantization}.dense_bits", where,
                           minimum=1)
    if not isinstance(expert_parallel, bool):
        raise PdError(where, "expert_parallel", f"{expert_parallel!r} is not true/false",
                      "pass whether --enable-expert-parallel is set")
    dense = -(-dense_params * dense_bits // (8 * tp))
    if expert_parallel:
        ep = dp * tp
        per_npu = -(-experts // ep)
        expert = -(-expert_params * expert_bits * per_npu // (8 * experts))
    else:
        ep, per_npu = 1, None
        expert = -(-expert_params * expert_bits // (8 * tp))
    return {"total_bytes": expert + dense, "expert_bytes": expert, "dense_bytes": dense, "ep_size": ep,
            "experts_per_npu": per_npu, "quantization": quantization}


def runtime_reserve(reserve, max_num_batched_tokens):
    """Bytes per NPU that vLLM's budget loses besides weights and KV (estimate, models.yml).

    ``reserve`` is a family's ``runtime_reserve`` entry: fixed_bytes_per_npu (communication buffers,
    workspace, graphs) + activation_bytes_per_batched_token x max_num_batched_tokens (the peak
    activation of one step grows with its tokens). Returns ``{total_bytes, fixed_bytes,
    activation_bytes, hbm_not_exposed_bytes}``; the last is HBM the device never exposes
    (``hbm_not_exposed_bytes_per_npu``, 0 when unset), taken off before gpu_memory_utilization and
    not part of ``total_bytes``.
    """
    where = "pd_runtime_reserve"
    reserve = _mapping(reserve, "runtime_reserve", where)
    fixed = check_int(reserve.get("fixed_bytes_per_npu"), "runtime_reserve.fixed_bytes_per_npu", where, minimum=0)
    per_token = check_int(reserve.get("activation_bytes_per_batched_token"),
                          "runtime_reserve.activation_bytes_per_batched_token", where, minimum=0)
    not_exposed = check_int(reserve.get("hbm_not_exposed_bytes_per_npu", 0),
                            "runtime_reserve.hbm_not_exposed_bytes_per_npu", where, minimum=0)
    check_int(max_num_batched_tokens, "max_num_batched_tokens", where, minimum=1)
    activation = per_token * max_num_batched_tokens
    return {"total_bytes": fixed + activation, "fixed_bytes": fixed, "activation_bytes": activation,
            "hbm_not_exposed_bytes": not_exposed}


def kv_budget_per_npu(hbm_per_npu, gpu_memory_utilization, weights_bytes, reserve_bytes, hbm_not_exposed_bytes=0):
    """Estimated KV cache bytes of one NPU: (HBM - not exposed) x gpu_memory_utilization - weights - reserve.

    vLLM sizes its KV cache as what is left of the device's total memory x gpu_memory_utilization
    after the weights, the profiled peak activation and the memory outside PyTorch. The total is what
    the device exposes, not its nominal HBM: a "64 GB" 910B exposes 60.96 GiB (vllm-ascend issue
    13439's start-up log), so ``hbm_not_exposed_bytes`` (models.yml runtime_reserve) comes off first.
    Returns ``{kv_bytes, usable_bytes, exposed_bytes, weights_bytes, reserve_bytes, fits}``;
    ``kv_bytes`` is negative when the weights and the reserve alone exceed the budget (``fits``
    false: the engine cannot start).
    """
    where = "pd_kv_budget_per_npu"
    hbm = to_bytes(hbm_per_npu, field="hbm_per_npu", where=where)
    util = check_number(gpu_memory_utilization, "gpu_memory_utilization", where, low=0, high=1, low_open=True)
    check_int(weights_bytes, "weights_bytes", where, minimum=0)
    check_int(reserve_bytes, "reserve_bytes", where, minimum=0)
    check_int(hbm_not_exposed_bytes, "hbm_not_exposed_bytes", where, minimum=0)
    exposed = max(0, hbm - hbm_not_exposed_bytes)
    usable = int(exposed * util)
    kv = usable - weights_bytes - reserve_bytes
    return {"kv_bytes": kv, "usable_bytes": usable, "exposed_bytes": exposed, "weights_bytes": weights_bytes,
            "reserve_bytes": reserve_bytes, "fits": kv > 0}


#: Ascend device families whose KV cache layout vllm-ascend sets itself (models.yml kv_cache_layout).
DEVICE_FAMILIES = ("a2", "a3")


def kv_bytes_per_token(layout, device_family="a2"):
    """Marginal KV cache bytes per token per worker (NPU) derived from a model's cache layout.

    ``layout`` is a family's ``kv_cache_layout`` entry of plugins/plugin_utils/data/models.yml: the number of
    layers per compress ratio, the attention cache's head size, the indexer cache (head size, scale
    entries, the ratios that have one) and, per device family, the bytes of each element. A layer
    of compress ratio r keeps one cache entry per r tokens (one latent head, held whole by every
    worker), so per token it costs (attention entry + indexer entry if any) / r; layers of ratio
    <= 1 keep only a sliding window, a per-request cost that does not grow with context.

    Returns ``{bytes_per_token, by_ratio: {ratio: bytes per token of all its layers},
    attention_entry_bytes, indexer_entry_bytes, device_family}`` (bytes_per_token may be fractional).
    """
    where = "pd_kv_bytes_per_token"
    layout = _mapping(layout, "kv_cache_layout", where)
    dev = _entry(layout.get("device_families"), device_family, "kv_cache_layout.device_families", "device_family",
                 where, "give the device family of the machines (a2: 910B, 8 NPUs; a3: 16 NPUs)")

    def num(mapping, key, field):
        return check_int(mapping.get(key), field, where, minimum=0)

    layers = _mapping(layout.get("layers_by_compress_ratio"), "kv_cache_layout.layers_by_compress_ratio", where)
    indexer = _mapping(layout.get("indexer"), "kv_cache_layout.indexer", where)
    head = num(layout, "attention_head_size", "kv_cache_layout.attention_head_size")
    attention = (head + num(dev, "attention_extra_head", f"device_families.{device_family}.attention_extra_head")) \
        * num(dev, "attention_dtype_bytes", f"device_families.{device_family}.attention_dtype_bytes")
    index_entry = (num(indexer, "head_size", "kv_cache_layout.indexer.head_size")
                   * num(dev, "indexer_dtype_bytes", f"device_families.{device_family}.indexer_dtype_bytes")
                   + num(indexer, "scale_entries", "kv_cache_layout.indexer.scale_entries")
                   * num(dev, "indexer_scale_bytes", f"device_families.{device_family}.indexer_scale_bytes"))
    with_indexer = indexer.get("compress_ratios") or []
    by_ratio, total = {}, Fraction(0)
    for ratio, count in sorted(layers.items(), key=lambda kv: int(kv[0])):
        ratio, count = int(ratio), check_int(count, f"kv_cache_layout.layers_by_compress_ratio.{ratio}", where,
                                             minimum=0)
        if ratio <= 1:
            by_ratio[ratio] = 0
            continue
        entry = attention + (index_entry if ratio in with_indexer else 0)
        cost = Fraction(count * entry, ratio)
        by_ratio[ratio] = float(cost)
        total += cost
    return {"bytes_per_token": float(total), "by_ratio": by_ratio, "attention_entry_bytes": attention,
            "indexer_entry_bytes": index_entry, "device_family": device_family}


def role_kv_budget(family, quantization, hbm_per_npu, gpu_memory_utilization, tp, dp, max_num_batched_tokens,
                   expert_parallel=None):
    """KV budget estimate of one role's ranks, per NPU, per DP group (TP NPUs) and per instance (x DP).

    ``family`` is a models.yml family entry with ``weights`` and ``runtime_reserve``; ``expert_parallel``
    None takes the family's ``weights.expert_parallel``. A per-DP-group figure is the HBM bytes of
    its TP NPUs (each NPU of an MLA model holds the whole latent KV of its tokens, so tokens per DP
    group = per-NPU bytes / bytes per token per worker). Returns the weights and reserve breakdowns,
    ``kv_per_npu_bytes``, ``kv_per_dp_group_bytes``, ``kv_per_instance_bytes`` (0 when nothing is
    left), ``fits`` and ``estimate`` (always true: measured by playbooks/baseline.yml).
    """
    where = "pd_role_kv_budget"
    family = _mapping(family, "family", where)
    weights = family.get("weights")
    if expert_parallel is None:
        expert_parallel = bool(_mapping(weights, "weights", where).get("expert_parallel", False))
    w = weights_per_npu(weights, quantization, tp, dp, expert_parallel)
    r = runtime_reserve(family.get("runtime_reserve"), max_num_batched_tokens)
    b = kv_budget_per_npu(hbm_per_npu, gpu_memory_utilization, w["total_bytes"], r["total_bytes"],
                          r["hbm_not_exposed_bytes"])
    per_npu = max(0, b["kv_bytes"])
    return {"weights": w, "reserve": r, "usable_per_npu_bytes": b["usable_bytes"],
            "exposed_per_npu_bytes": b["exposed_bytes"],
            "kv_per_npu_bytes": per_npu, "kv_per_dp_group_bytes": per_npu * tp,
            "kv_per_instance_bytes": per_npu * tp * dp, "shortfall_bytes": max(0, -b["kv_bytes"]),
            "fits": b["fits"], "expert_parallel": expert_parallel, "estimate": True}


def ram_guidance(offload_bytes):
    """Host RAM the article advises for ``offload_bytes`` of pinned CPU offload on the host.

    The article pairs 200 GB of offload with >= 512 GB of RAM: the offload pool plus "system + vLLM
    base" (312 GiB). Generalised additively: offload + 312 GiB, because the base (the OS, the
    engines' processes, model files in page cache while loading) does not shrink with the pool.
    Returns 0 without offload (the article gives no guidance there; the hard floor is
    pinned + pd_host_ram_reserve).
    """
    off = to_bytes(offload_bytes, field="offload_bytes", where="pd_ram_guidance")
    if off == 0:
        return 0
    return off + RAM_GUIDANCE_RAM - RAM_GUIDANCE_OFFLOAD


def family_data(family):
    """The models.yml entry of ``family`` (a fresh copy), or None when the file has no such family."""
    return datafiles.yaml_data("models.yml").get(family)


def _quantization(cluster):
    quant = (cluster.get("model") or {}).get("quantization")
    return quant or datafiles.yaml_data("defaults.yml")["cluster"]["model"]["quantization"]


def _expert_parallel(cluster, rcfg):
    """--enable-expert-parallel as rendered: the cluster's resolved recipe, else the role's engine
    key, else None (the family's weights.expert_parallel)."""
    value = (cluster.get("recipe") or {}).get("enable_expert_parallel")
    if value is None:
        value = rcfg["engine"].get("enable_expert_parallel")
    return value if isinstance(value, bool) else None


def _role_estimate(fam, quant, host, rcfg, dp=None, tp=None, expert_parallel=None):
    eng = rcfg["engine"]
    return role_kv_budget(fam, quant, host["hbm_per_npu_bytes"], eng["gpu_memory_utilization"],
                          tp or rcfg["tp"], dp or rcfg["dp"], eng["max_num_batched_tokens"], expert_parallel)


def cluster_role_kv(cluster, role, hosts):
    """Weight-based KV estimate of one role of a normalized cluster on each of its hosts.

    Returns None when the model family has no ``weights`` / ``runtime_reserve`` data (the report
    then falls back to the article's rule of thumb), else ``{"hosts": {name: role_kv_budget},
    "worst": the host with the least KV per NPU, "quantization", "family"}``.
    """
    family = (cluster.get("model") or {}).get("family")
    fam = family_data(family)
    if not fam or "weights" not in fam or "runtime_reserve" not in fam:
        return None
    quant = _quantization(cluster)
    rcfg = cluster["roles"][role]
    ep = _expert_parallel(cluster, rcfg)
    per_host = {h["name"]: _role_estimate(fam, quant, h, rcfg, expert_parallel=ep) for h in hosts}
    worst = min(per_host, key=lambda n: per_host[n]["kv_per_npu_bytes"] - per_host[n]["shortfall_bytes"])
    return {"hosts": per_host, "worst": worst, "quantization": quant, "family": family, "expert_parallel": ep}


def weights_fit_problems(cluster, role, hosts):
    """One ``(host, message, fix)`` per host of ``role`` whose NPUs cannot hold the weights.

    The message gives the arithmetic (weights, reserve, usable HBM); the fix names the smallest
    change found that fits: more DP ranks per instance (experts spread over DP x TP with expert
    parallel), a smaller quantization, or more HBM.
    """
    est = cluster_role_kv(cluster, role, hosts)
    if est is None:
        return []
    fam = family_data(est["family"])
    rcfg = cluster["roles"][role]
    out = []
    for host in hosts:
        b = est["hosts"][host["name"]]
        if b["fits"]:
            continue
        w, r = b["weights"], b["reserve"]
        split = (f"{w['experts_per_npu']} of {fam['weights']['n_routed_experts']} experts per NPU over EP"
                 f"{w['ep_size']}" if b["expert_parallel"] else f"experts TP-sharded over TP{rcfg['tp']}")
        message = (f"{est['quantization']} weights need ~{to_human(w['total_bytes'])} per NPU ({split}: "
                   f"{to_human(w['expert_bytes'])}; dense over TP{rcfg['tp']}: {to_human(w['dense_bytes'])}) + "
                   f"~{to_human(r['total_bytes'])} runtime/activation reserve, but "
                   f"{to_human(host['hbm_per_npu_bytes'])} x gpu_memory_utilization "
                   f"{rcfg['engine']['gpu_memory_utilization']} = {to_human(b['usable_per_npu_bytes'])} "
                   f"(of the {to_human(b['exposed_per_npu_bytes'])} the device exposes): "
                   f"no HBM is left for KV, the engine cannot start (estimate, plugins/plugin_utils/data/models.yml)")
        fixes = []
        for factor in (2, 4, 8):
            dp = rcfg["dp"] * factor
            if _role_estimate(fam, est["quantization"], host, rcfg, dp=dp, expert_parallel=est["expert_parallel"])["fits"]:
                fixes.append(f"spread the instance over more NPUs ({role}.dp {dp} x tp {rcfg['tp']} fits)")
                break
        smaller = [q for q, bits in sorted(fam["weights"]["quantizations"].items(),
                                           key=lambda kv: -kv[1]["expert_bits"])
                   if bits["expert_bits"] < fam["weights"]["quantizations"][est["quantization"]]["expert_bits"]
                   and _role_estimate(fam, q, host, rcfg, expert_parallel=est["expert_parallel"])["fits"]]
        if smaller:
            fixes.append(f"use a smaller checkpoint (model.quantization: {smaller[0]} fits)")
        fixes.append("or hosts with more HBM per NPU (pd_hbm_per_npu)")
        out.append((host["name"], message, "; ".join(fixes)))
    return out
