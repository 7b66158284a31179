# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules on the scheduler: batched tokens per step (prefill and decode), graph capture, speculative
decoding, prefix cache retention, context length and partial prefills."""

from ...plan import capacity
from ..violation import violation
from .context import ROLES, _is_int, _where


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
