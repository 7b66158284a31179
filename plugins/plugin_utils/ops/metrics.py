# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 1, metrics: read a vLLM ``/metrics`` page (``parse_metrics``) and the change between two
scrapes (``metrics_window``)."""

import math
from collections.abc import Mapping

from ..shared import sizes
from ..shared.errors import PdError

# The DOMAIN.md §6 signals, by their exposition names; values are read from samples by name so that
# missing TYPE lines (or a counter declared with or without _total) do not matter.
_SUM_GAUGES = {"vllm:num_requests_running": "num_requests_running",
               "vllm:num_requests_waiting": "num_requests_waiting"}
#: kv usage: vLLM V1 name first, V0's gpu_cache_usage_perc as a fallback; the maximum over engines.
_MAX_GAUGES = {"vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
               "vllm:gpu_cache_usage_perc": "kv_cache_usage_perc"}
_COUNTERS = {"vllm:num_preemptions": "num_preemptions", "vllm:prompt_tokens": "prompt_tokens",
             "vllm:generation_tokens": "generation_tokens", "vllm:request_success": "request_success"}
_HISTOGRAMS = {"vllm:time_to_first_token_seconds": "time_to_first_token_seconds"}
# prompt tokens by where their KV came from (vLLM v0.27.1 vllm/v1/metrics/stats.py PromptTokenStats:
# local_compute + local_cache_hit + external_kv_transfer = prompt tokens), one counter per source
_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
_SIGNALS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions", "vllm:time_to_first_token_seconds")


def le_value(text):
    """A histogram bucket's ``le`` label as a number (``+Inf`` is ``math.inf``)."""
    return math.inf if text in ("+Inf", "Inf", "inf") else float(text)


def quantile(buckets, q):
    """Prometheus' histogram_quantile over cumulative ``[(le, count)]`` sorted by le; None if empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for index, (le, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(le):
                finite = [b for b, _count in buckets if not math.isinf(b)]
                return finite[-1] if finite else None
            if index == 0 and le <= 0:
                return le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None  # pragma: no cover - the +Inf bucket always holds the total


def _histogram(buckets, total_sum, count):
    """Summary dict of one histogram from {le text: cumulative count}, sum and count."""
    ordered = sorted(((le_value(le), le, value) for le, value in buckets.items()), key=lambda b: b[0])
    pairs = [(le, value) for le, _text, value in ordered]
    return {
        "count": count,
        "sum": total_sum,
        "mean": (total_sum / count) if count else None,
        "p50": quantile(pairs, 0.5),
        "p95": quantile(pairs, 0.95),
        "buckets": [{"le": text, "count": value} for _le, text, value in ordered],
    }


def parse_metrics(text):
    """Read the DOMAIN.md §6 signals from a vLLM ``/metrics`` page (Prometheus text format).

    Returns ``{num_requests_running, num_requests_waiting, kv_cache_usage_perc, num_preemptions,
    prompt_tokens, generation_tokens, request_success, time_to_first_token_seconds, engines,
    missing}``. Gauges of requests and counters are summed over label sets (one per engine /
    model_name: the rank's total); ``kv_cache_usage_perc`` is the maximum (the fullest engine); the
    TTFT histogram is merged bucket by bucket into ``{count, sum, mean, p50, p95, buckets}``. A
    signal the page does not carry is None and listed in ``missing``. Counters are read from their
    ``_total`` samples (``_created`` is ignored). ``prompt_tokens_by_source`` is
    ``{local_compute, local_cache_hit, external_kv_transfer, ...}`` (summed per ``source`` label) or
    None when the engine does not expose ``vllm:prompt_tokens_by_source_total`` (not a DOMAIN.md §6
    signal: never listed in ``missing``).
    """
    where = "pd_parse_metrics"
    if not isinstance(text, str):
        raise PdError(where, "text", f"{type(text).__name__} is not a metrics page",
                      "pass the body of GET /metrics (uri return_content: true, .content)")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # pragma: no cover - depends on the controller's packages
        raise PdError(where, "prometheus_client", "the package is not installed on the controller",
                      "pip install -r requirements.txt (prometheus_client==0.26.0)") from None
    values = {}
    hists = {}
    engines = set()
    by_source = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, value = sample.name, float(sample.value)
                if math.isnan(value):
                    continue
                if name.startswith("vllm:") and "engine" in sample.labels:
                    engines.add(str(sample.labels["engine"]))
                if name == _BY_SOURCE:
                    by_source = by_source or {}
                    source = str(sample.labels.get("source", ""))
                    by_source[source] = by_source.get(source, 0.0) + value
                elif name in _SUM_GAUGES:
                    key = _SUM_GAUGES[name]
                    values[key] = values.get(key, 0.0) + value
                elif name in _MAX_GAUGES:
                    key = _MAX_GAUGES[name]
                    values[key] = max(values.get(key, value), value)
                elif name.endswith("_total") and name[:-6] in _COUNTERS:
                    key = _COUNTERS[name[:-6]]
                    values[key] = values.get(key, 0.0) + value
                else:
                    for base, key in _HISTOGRAMS.items():
                        if name == base + "_bucket":
                            bucket = hists.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})["buckets"]
                            le = sample.labels.get("le", "+Inf")
                            bucket[le] = bucket.get(le, 0.0) + value
                        elif name in (base + "_sum", base + "_count"):
                            entry = hists.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
                            field = name[len(base) + 1:]
                            entry[field] += value
    except ValueError as exc:
        raise PdError(where, "text", f"not Prometheus text exposition format ({exc})",
                      "pass the body of GET /metrics of a vLLM engine") from None
    out = {key: values.get(key) for key in
           ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions",
            "prompt_tokens", "generation_tokens", "request_success")}
    for key in _HISTOGRAMS.values():
        entry = hists.get(key)
        out[key] = _histogram(entry["buckets"], entry["sum"], entry["count"]) if entry else None
    short = {"vllm:num_requests_running": "num_requests_running",
             "vllm:num_requests_waiting": "num_requests_waiting",
             "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
             "vllm:num_preemptions": "num_preemptions",
             "vllm:time_to_first_token_seconds": "time_to_first_token_seconds"}
    out["missing"] = [name for name in _SIGNALS if out[short[name]] is None]
    out["engines"] = sorted(engines)
    out["prompt_tokens_by_source"] = by_source
    return out


def sample(item, where, index):
    """A parse_metrics result from a sample (a parsed dict or the page's text)."""
    if isinstance(item, str):
        return parse_metrics(item)
    if isinstance(item, Mapping) and "missing" in item:
        return item
    raise PdError(where, f"samples[{index}]", f"{type(item).__name__} is not a metrics sample",
                  "pass /metrics texts or pd_parse_metrics results, oldest first")


def _bucket_delta(first, second):
    """Cumulative bucket counts of second minus first, matched by le; None when unusable."""
    if not second:
        return None
    before = {b["le"]: b["count"] for b in (first or {}).get("buckets", [])}
    buckets = {b["le"]: b["count"] - before.get(b["le"], 0.0) for b in second["buckets"]}
    if any(v < 0 for v in buckets.values()):
        return None
    return buckets


def metrics_window(first, second, seconds=None):
    """What happened between two scrapes of one rank (oldest first).

    Returns ``{requests, preemptions, prompt_tokens, generation_tokens, avg_prompt_tokens,
    ttft_mean, ttft_p50, ttft_p95, generation_tokens_per_s, num_requests_running,
    num_requests_waiting, kv_cache_usage_perc, reset, prompt_tokens_by_source}``: counter increases, TTFT of the requests
    that finished their first token in the window (from the histogram's bucket differences), the
    gauges at the second scrape. A counter that went down means the engine restarted: the second
    scrape's values are taken as the window and ``reset`` is true. ``seconds`` (the time between
    the scrapes) gives ``generation_tokens_per_s``.
    """
    where = "pd_metrics_window"
    a, b = sample(first, where, 0), sample(second, where, 1)
    counters = ("num_preemptions", "prompt_tokens", "generation_tokens", "request_success")
    reset = any(a[k] is not None and b[k] is not None and b[k] < a[k] for k in counters)
    ha, hb = a["time_to_first_token_seconds"], b["time_to_first_token_seconds"]
    if hb and ha and hb["count"] < ha["count"]:
        reset = True
    base = {k: 0.0 for k in counters} if reset else a

    def delta(key):
        if b[key] is None:
            return None
        return b[key] - (base[key] or 0.0)

    out = {key: delta(key) for key in ("prompt_tokens", "generation_tokens")}
    out["preemptions"] = delta("num_preemptions")
    ttft_requests = ttft_sum = None
    ttft_p50 = ttft_p95 = None
    if hb:
        start = None if reset else ha
        ttft_requests = hb["count"] - ((start or {}).get("count") or 0.0)
        ttft_sum = hb["sum"] - ((start or {}).get("sum") or 0.0)
        buckets = _bucket_delta(start, hb)
        if buckets is not None:
            pairs = sorted(((le_value(le), c) for le, c in buckets.items()), key=lambda p: p[0])
            ttft_p50, ttft_p95 = quantile(pairs, 0.5), quantile(pairs, 0.95)
    finished = delta("request_success")
    requests = ttft_requests if ttft_requests is not None else finished
    out["requests"] = requests
    out["avg_prompt_tokens"] = (out["prompt_tokens"] / requests
                                if requests and out["prompt_tokens"] is not None else None)
    out["ttft_mean"] = (ttft_sum / ttft_requests) if ttft_requests else None
    out["ttft_p50"], out["ttft_p95"] = ttft_p50, ttft_p95
    out["ttft_buckets"] = _bucket_delta(None if reset else ha, hb) if hb else None
    out["generation_tokens_per_s"] = None
    if seconds and out["generation_tokens"] is not None:
        check = sizes.check_number(seconds, "seconds", where, low=0, low_open=True)
        out["generation_tokens_per_s"] = out["generation_tokens"] / float(check)
    for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        out[key] = b[key]
    out["reset"] = reset
    # prompt tokens per KV source in the window (None when either scrape lacks them)
    src_a, src_b = (None if reset else a.get("prompt_tokens_by_source")), b.get("prompt_tokens_by_source")
    out["prompt_tokens_by_source"] = None
    if src_b is not None and (reset or src_a is not None):
        out["prompt_tokens_by_source"] = {k: v - (src_a or {}).get(k, 0.0) for k, v in src_b.items()}
    return out
