"""Capacity arithmetic from the article (DOMAIN.md §4, §5): KV budget, token budgets, concurrency.

All functions are pure; sizes accept human strings (``"64GiB"``) through ``pd_deploy.sizes``.
Ratios such as ``gpu_memory_utilization`` are taken at their decimal value (0.85 is 17/20), and
byte and token results are rounded down, so the figures are exact and repeatable.
"""

from fractions import Fraction

from pd_deploy.errors import PdError
from pd_deploy.sizes import check_int, check_number, to_bytes

#: max-num-batched-tokens levels measured on 910B3 (64 GB per NPU) at TP4 (article §4.2).
SWEET_SPOT = 32768
UPPER_BOUND = 49152
DANGER_ZONE = 65536

#: The article's starting value for max-num-seqs (per DP group), raised while KV usage stays < 0.7.
START_MAX_NUM_SEQS = 32

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


def kv_budget(hbm_per_device, devices, gpu_memory_utilization, kv_share=0.6, dp=1):
    """Estimate the KV cache bytes of one host and of each of its DP groups.

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

    ``"ok"`` up to the sweet spot (32768); ``"upper"`` above it up to 65536 (49152 is the upper
    bound the article recommends, 65536 the edge of the danger zone: watch activation memory);
    ``"danger"`` above 65536 (activation OOM). The thresholds were measured at TP4 and are applied
    unchanged for other ``tp`` values: treat them as a starting point there.
    """
    where = "pd_batched_tokens_level"
    check_int(value, "max_num_batched_tokens", where, minimum=1)
    check_int(tp, "tp", where, minimum=1)
    if value <= SWEET_SPOT:
        return "ok"
    if value <= DANGER_ZONE:
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
    on TP4: the result is 2 x avg rounded up with level ``"error"``.

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

    concurrency = max(1, min(max_num_seqs x dp, fit)) with fit = max_num_batched_tokens // avg
    prompt. ``fit`` is returned separately: fit < 1 means every prompt is chunked over several
    steps and only one runs while the rest wait ("max-num-seqs=32 but only 1 running": a 16K prompt
    cannot fit 8192); fit < 2 breaks the ">= 2 x average prompt" rule.

    Returns ``{concurrency, fit, seq_cap, limited_by, chunked, level, message}`` where ``level`` is
    ``"ok"`` or ``"warning"``.
    """
    where = "pd_expected_p_concurrency"
    check_int(max_num_seqs, "max_num_seqs", where, minimum=1)
    check_int(dp, "dp", where, minimum=1)
    check_int(max_num_batched_tokens, "max_num_batched_tokens", where, minimum=1)
    check_int(avg_prompt_tokens, "avg_prompt_tokens", where, minimum=1)
    seq_cap = max_num_seqs * dp
    fit = max_num_batched_tokens // avg_prompt_tokens
    concurrency = max(1, min(seq_cap, fit))
    limited_by = "max_num_seqs" if seq_cap <= fit else "max_num_batched_tokens"
    chunked = fit < 1
    if chunked:
        message = (
            f"an average prompt of {avg_prompt_tokens} tokens does not fit max-num-batched-tokens "
            f"{max_num_batched_tokens}: prompts are chunked and only 1 runs while the rest wait; "
            f"raise max-num-batched-tokens to >= {2 * avg_prompt_tokens}"
        )
    elif fit < 2:
        message = (
            f"max-num-batched-tokens {max_num_batched_tokens} fits only {fit} average prompt "
            f"({avg_prompt_tokens} tokens) per step; raise it to >= {2 * avg_prompt_tokens}"
        )
    else:
        message = f"{concurrency} prompts per step (limited by {limited_by})"
    return {
        "concurrency": concurrency,
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


FILTERS = {
    "pd_kv_budget": kv_budget,
    "pd_kv_tokens": kv_tokens,
    "pd_batched_tokens_level": batched_tokens_level,
    "pd_recommend_batched_tokens": recommend_batched_tokens,
    "pd_expected_p_concurrency": expected_p_concurrency,
    "pd_recommend_max_num_seqs": recommend_max_num_seqs,
    "pd_retention_interval": retention_interval,
    "pd_d_batched_tokens": d_batched_tokens,
}
