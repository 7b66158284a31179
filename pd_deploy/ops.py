"""The operator's workflow after a deploy (DOMAIN.md §5-§7): read signals, judge them, act on one knob.

Plain functions behind the ``pd_*`` filters that ``playbooks/health-check.yml``, ``baseline.yml``,
``capacity-report.yml``, ``token-gate.yml``, ``tune.yml`` and ``monitoring.yml`` use:

- metrics: ``parse_metrics`` reads a vLLM ``/metrics`` page, ``metrics_window`` the change between
  two scrapes;
- health: ``diagnose`` applies the article's pitfall table to a rank's scrapes (and its log),
  ``verdict`` sums findings up; ``health_ranks`` / ``health_clusters`` adapt Ansible loop results;
- correctness: ``token_gate`` compares two answer sets token by token;
- tuning: ``one_change`` insists that exactly one parameter changed;
- KV capacity: ``baseline_report`` (bare-engine start-up logs at two max-model-len values),
  ``capacity_report`` and ``capacity_chart_svg``;
- monitoring: ``prometheus_scrape_config`` and ``grafana_dashboard``.

Nothing here talks to a host; no module level mutable state. Bad input raises ``PdError``.
"""

import copy
import math
import re
from collections.abc import Mapping
from xml.sax.saxutils import escape

import yaml

from pd_deploy import capacity, datafiles, logparse, model, sizes
from pd_deploy.containers import clean_log, docker_log_text, docker_logs, log_tail  # noqa: F401  (re-exported)
from pd_deploy.errors import PdError

GIB = 1024 ** 3
DEFAULT_FAMILY = "deepseek_v4_flash"

#: kv_cache_usage_perc above this is "the KV pool is nearly empty" (article's pitfall table).
KV_HIGH = 0.9
#: ... when it holds for this many consecutive scrapes ("sustained").
KV_SUSTAIN = 2
#: TTFT of the last window this many times the earlier mean is "TTFT grows".
TTFT_GROWTH = 1.5
#: One step down for max-num-seqs when KV is short (x 3/4, at least 1).
SEQS_STEP = (3, 4)
#: max-num-batched-tokens levels of the article's 910B3 TP4 table, high to low.
BATCH_LEVELS = (65536, 49152, 32768, 24576, 16384)
#: The offload the article adds when KV is short (host total per role).
ARTICLE_OFFLOAD = "200GiB"
RECOMPUTE_LINE = "[RecomputeScheduler] Recompute triggered for request"
_OOM_RE = re.compile(r"out of memory|OutOfMemoryError|NPU OOM", re.IGNORECASE)
SEVERITIES = ("critical", "warning", "info")

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
_SIGNALS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions", "vllm:time_to_first_token_seconds")


# ---------------------------------------------------------------------------------------------------
# model data (pd_deploy/data/models.yml)

def models():
    """A fresh copy of pd_deploy/data/models.yml (expected KV footprint per model family)."""
    return datafiles.yaml_data("models.yml")


def _family(family, where):
    data = models()
    name = family or DEFAULT_FAMILY
    if name not in data:
        raise PdError(where, "family", f"{name!r} is not in pd_deploy/data/models.yml",
                      f"use one of {', '.join(sorted(data))} (pd_cluster.model.family) or add the family there")
    return data[name]


def model_band(family=None, override=None):
    """Expected marginal KV bytes per token per worker of a model family: ``{min, max, source}``.

    ``override`` (a dict with the same keys, e.g. the ``pd_ops_kv_band`` variable) replaces the
    data file's band; its ``source`` must say where the numbers come from.
    """
    where = "pd_model_band"
    if override:
        if not isinstance(override, Mapping):
            raise PdError(where, "override", f"{type(override).__name__} is not a band",
                          "give {min: <bytes>, max: <bytes>, source: <where the numbers come from>}")
        band = {key: override.get(key) for key in ("min", "max", "source")}
        for key in ("min", "max"):
            sizes.check_number(band[key], f"override.{key}", where, low=0, low_open=True)
        if not isinstance(band["source"], str) or not band["source"].strip():
            raise PdError(where, "override.source", f"{band['source']!r} is not a source",
                          "say where the band's numbers come from (a measurement, a report, an issue)")
        if band["min"] > band["max"]:
            raise PdError(where, "override.min", f"{band['min']} is above max {band['max']}", "swap min and max")
        return band
    return dict(_family(family, where)["bytes_per_token"])


def model_estimate(family=None):
    """Configured per-request footprint estimate of a family: ``{marginal_bytes_per_token,
    fixed_bytes_per_request, source}`` (used until a baseline has measured the cluster)."""
    return dict(_family(family, "pd_model_estimate")["estimate"])


# ---------------------------------------------------------------------------------------------------
# metrics

def _le_value(text):
    return math.inf if text in ("+Inf", "Inf", "inf") else float(text)


def _quantile(buckets, q):
    """Prometheus' histogram_quantile over cumulative ``[(le, count)]`` sorted by le; None if empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for index, (le, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(le):
                finite = [b for b, _ in buckets if not math.isinf(b)]
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
    ordered = sorted(((_le_value(le), le, value) for le, value in buckets.items()), key=lambda b: b[0])
    pairs = [(le, value) for le, _, value in ordered]
    return {
        "count": count,
        "sum": total_sum,
        "mean": (total_sum / count) if count else None,
        "p50": _quantile(pairs, 0.5),
        "p95": _quantile(pairs, 0.95),
        "buckets": [{"le": text, "count": value} for _, text, value in ordered],
    }


def parse_metrics(text):
    """Read the DOMAIN.md §6 signals from a vLLM ``/metrics`` page (Prometheus text format).

    Returns ``{num_requests_running, num_requests_waiting, kv_cache_usage_perc, num_preemptions,
    prompt_tokens, generation_tokens, request_success, time_to_first_token_seconds, engines,
    missing}``. Gauges of requests and counters are summed over label sets (one per engine /
    model_name: the rank's total); ``kv_cache_usage_perc`` is the maximum (the fullest engine); the
    TTFT histogram is merged bucket by bucket into ``{count, sum, mean, p50, p95, buckets}``. A
    signal the page does not carry is None and listed in ``missing``. Counters are read from their
    ``_total`` samples (``_created`` is ignored).
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
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, value = sample.name, float(sample.value)
                if math.isnan(value):
                    continue
                if name.startswith("vllm:") and "engine" in sample.labels:
                    engines.add(str(sample.labels["engine"]))
                if name in _SUM_GAUGES:
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
    return out


def _sample(item, where, index):
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
    num_requests_waiting, kv_cache_usage_perc, reset}``: counter increases, TTFT of the requests
    that finished their first token in the window (from the histogram's bucket differences), the
    gauges at the second scrape. A counter that went down means the engine restarted: the second
    scrape's values are taken as the window and ``reset`` is true. ``seconds`` (the time between
    the scrapes) gives ``generation_tokens_per_s``.
    """
    where = "pd_metrics_window"
    a, b = _sample(first, where, 0), _sample(second, where, 1)
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
            pairs = sorted(((_le_value(le), c) for le, c in buckets.items()), key=lambda p: p[0])
            ttft_p50, ttft_p95 = _quantile(pairs, 0.5), _quantile(pairs, 0.95)
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
    return out


# ---------------------------------------------------------------------------------------------------
# diagnosis (the article's pitfall table, DOMAIN.md §6)

def _normalized(config, where):
    """The normalized cluster of a raw ``pd_cluster`` dict (or an already normalized one)."""
    if not isinstance(config, Mapping):
        raise PdError(where, "config", f"{type(config).__name__} is not a cluster configuration",
                      "pass the cluster's pd_cluster (hostvars[host].pd_cluster)")
    if isinstance(config.get("roles"), Mapping):
        return config
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise PdError(where, "config.name", f"{name!r} is not a cluster name",
                      "pass the cluster's pd_cluster dict, whose name is its inventory group")
    return model.normalize(name, dict(config))


def normalized_cluster(config):
    """The normalized cluster (defaults merged, sizes in bytes; docs/design.md) of a ``pd_cluster`` dict."""
    return _normalized(config, "pd_normalized_cluster")


def _role(role, where):
    if role not in model.ROLES:
        raise PdError(where, "role", f"{role!r} is not a role", f"use one of {', '.join(model.ROLES)}")
    return role


def p99_request_len(cluster):
    """The business P99 request length: p99 prompt + p99 output tokens (what max-model-len should be)."""
    work = cluster["workload"]
    return work["p99_prompt_tokens"] + work["p99_output_tokens"]


def count_recompute(log_text):
    """How many ``[RecomputeScheduler] Recompute triggered for request`` lines a log holds.

    Accepts a string or a list of lines (Docker's stream framing bytes are tolerated).
    """
    if isinstance(log_text, (list, tuple)):
        log_text = "\n".join(str(line) for line in log_text)
    if not isinstance(log_text, str):
        raise PdError("pd_count_recompute", "log_text", f"{type(log_text).__name__} is not log text",
                      "pass the container's log (Docker logs API content) as a string")
    return sum(1 for line in clean_log(log_text).splitlines() if RECOMPUTE_LINE in line)


def _finding(severity, signal, value, meaning, action, where, change=None):
    return {"severity": severity, "signal": signal, "value": value, "meaning": meaning,
            "action": action, "where": where, "change": change}


def _fmt(value, digits=3):
    if value is None:
        return "n/a"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _offload_hint(rcfg, role):
    """The article's offload for a role, as concrete inventory keys."""
    if role == "decode":
        if rcfg["offload_connector"] == "RecomputeCPUOffloadConnector":
            total = sizes.to_human(rcfg["cpu_offload_bytes"]) if rcfg["cpu_offload_bytes"] else "0"
            return f"raise decode.cpu_offload (now {total}; host RAM permitting)"
        return (f"add decode.offload_connector: RecomputeCPUOffloadConnector with decode.cpu_offload: "
                f"{ARTICLE_OFFLOAD} and decode.recompute_scheduler: true")
    if rcfg["offload_connector"] == "OffloadingConnector":
        total = sizes.to_human(rcfg["cpu_offload_bytes"]) if rcfg["cpu_offload_bytes"] else "0"
        return f"raise prefill.cpu_offload (now {total}; host RAM permitting)"
    return f"add prefill.offload_connector: OffloadingConnector with prefill.cpu_offload: {ARTICLE_OFFLOAD}"


def _ttft_windows(samples):
    """Mean TTFT of each window between consecutive samples, and the mean before the first one."""
    hists = [s["time_to_first_token_seconds"] for s in samples]
    before = hists[0]["mean"] if hists[0] and hists[0]["count"] else None
    windows = []
    for old, new in zip(hists, hists[1:]):
        if not old or not new:
            continue
        count = new["count"] - old["count"]
        if count > 0:
            windows.append((new["sum"] - old["sum"]) / count)
    return before, windows


def diagnose(samples, role, config, log_text=None, where=None, kv_high=KV_HIGH, sustain=KV_SUSTAIN,
             ttft_growth=TTFT_GROWTH):
    """Apply the article's pitfall table to one rank: scrapes (oldest first) and optionally its log.

    ``samples``: /metrics texts or ``parse_metrics`` results of one rank, oldest first (two or more
    to see trends). ``role``: prefill or decode. ``config``: the cluster's ``pd_cluster`` (raw or
    normalized): actions name its current values and the value to set. ``log_text``: the rank's
    recent log (recompute and out-of-memory lines). Thresholds: ``kv_high`` (0.9) held for
    ``sustain`` (2) scrapes; TTFT growth by ``ttft_growth`` (1.5x).

    Returns a list of findings ``{severity: critical|warning|info, signal, value, meaning, action,
    where, change}``; ``change`` is ``{param, value}`` (the inventory key to set and its value) when
    one parameter change is the fix, else None. An empty list means nothing to act on.
    """
    fn = "pd_diagnose"
    _role(role, fn)
    if not isinstance(samples, (list, tuple)) or not samples:
        raise PdError(fn, "samples", "no metrics samples", "pass one or more /metrics scrapes of the rank, oldest first")
    parsed = [_sample(item, fn, i) for i, item in enumerate(samples)]
    cluster = _normalized(config, fn)
    rcfg = cluster["roles"][role]
    eng = rcfg["engine"]
    where = where or f"{cluster['name']}/{role}"
    p99 = p99_request_len(cluster)
    avg = cluster["workload"]["avg_prompt_tokens"]
    findings = []

    # num_preemptions > 0: KV truly short
    preempt = [s["num_preemptions"] for s in parsed if s["num_preemptions"] is not None]
    if preempt:
        seqs = eng["max_num_seqs"]
        fewer = max(1, seqs * SEQS_STEP[0] // SEQS_STEP[1])
        grew = None
        if len(preempt) >= 2:
            grew = preempt[-1] - preempt[0] if preempt[-1] >= preempt[0] else preempt[-1]
        total = preempt[-1]
        if (grew is not None and grew > 0) or (grew is None and total > 0):
            parts = [f"lower {role}.engine.max_num_seqs from {seqs} to {fewer}"]
            if role == "decode" and rcfg["offload_connector"] != "RecomputeCPUOffloadConnector":
                parts.append(_offload_hint(rcfg, role))
            if eng["max_model_len"] > p99:
                parts.append(f"lower {role}.engine.max_model_len from {eng['max_model_len']} to {p99} "
                             f"(P99 prompt + output)")
            value = (f"+{_fmt(grew)} between the first and last scrape (total {_fmt(total)})"
                     if grew is not None else f"{_fmt(total)} since the engine started")
            findings.append(_finding(
                "critical", "vllm:num_preemptions", value,
                "KV truly short: running requests were evicted to make room (should stay 0)",
                " or ".join(parts), where, {"param": f"{role}.engine.max_num_seqs", "value": fewer}))
        elif total > 0:
            findings.append(_finding(
                "warning", "vllm:num_preemptions", f"{_fmt(total)} since the engine started, none between scrapes",
                "KV ran short earlier (e.g. a burst); not during this check",
                f"watch it; if it grows, lower {role}.engine.max_num_seqs from {eng['max_num_seqs']} to "
                f"{max(1, eng['max_num_seqs'] * SEQS_STEP[0] // SEQS_STEP[1])}", where))

    # kv_cache_usage_perc > 0.9 sustained: KV pool nearly empty
    usage = [s["kv_cache_usage_perc"] for s in parsed if s["kv_cache_usage_perc"] is not None]
    if usage and usage[-1] > kv_high:
        sustained = len(usage) >= sustain and all(u > kv_high for u in usage[-sustain:])
        parts = [_offload_hint(rcfg, role)]
        change = None
        if eng["max_model_len"] > p99:
            parts.append(f"lower {role}.engine.max_model_len from {eng['max_model_len']} to {p99} (P99 prompt + output)")
            change = {"param": f"{role}.engine.max_model_len", "value": p99}
        shown = ", ".join(f"{u:.2f}" for u in usage[-max(sustain, 1):])
        if sustained:
            findings.append(_finding(
                "warning", "vllm:kv_cache_usage_perc", f"{shown} (> {kv_high} in the last {sustain} scrapes)",
                "KV pool nearly empty: the next long request will preempt or wait", " or ".join(parts), where, change))
        else:
            findings.append(_finding(
                "info", "vllm:kv_cache_usage_perc", f"{usage[-1]:.2f} at the last scrape",
                f"above {kv_high} once; not sustained over {sustain} scrapes",
                "re-run the health check under load; if it stays above, " + " or ".join(parts), where))

    # running stuck at 1 with a queue on prefill: token budget < prompt
    if role == "prefill":
        pairs = [(s["num_requests_running"], s["num_requests_waiting"]) for s in parsed]
        stuck = [p for p in pairs if p[0] is not None and p[1] is not None]
        if stuck and len(stuck) == len(pairs) and all(r == 1 and w > 0 for r, w in stuck):
            measured = None
            if len(parsed) >= 2:
                measured = metrics_window(parsed[0], parsed[-1])["avg_prompt_tokens"]
            basis = max(avg, int(math.ceil(measured))) if measured else avg
            rec = capacity.recommend_batched_tokens(basis, tp=rcfg["tp"])
            configured = eng["max_num_batched_tokens"]
            note = f"measured average prompt {measured:.0f} tokens, " if measured else ""
            if configured < rec["recommended"]:
                action = (f"raise prefill.engine.max_num_batched_tokens from {configured} to {rec['recommended']} "
                          f"(>= 2 x average prompt {basis} = {2 * basis}; {rec['rule']})")
                change = {"param": "prefill.engine.max_num_batched_tokens", "value": rec["recommended"]}
            else:
                action = (f"prefill.engine.max_num_batched_tokens {configured} already meets the recommendation for "
                          f"an average prompt of {basis} tokens: the real prompts are longer; measure them, set "
                          f"workload.avg_prompt_tokens and raise max_num_batched_tokens to >= 2 x that average")
                change = None
            if rec["level"] == "error":
                action += " (beyond the TP4 table: activation OOM risk)"
            waiting = ", ".join(_fmt(w) for _, w in stuck)
            findings.append(_finding(
                "critical" if len(stuck) >= 2 else "warning", "vllm:num_requests_running",
                f"running 1 with waiting {waiting} in every scrape ({note}configured average {avg})",
                "token budget < prompt: one prompt fills max-num-batched-tokens, the rest queue "
                "(max-num-seqs is not the limit)", action, where, change))

    # TTFT grows between scrapes (prefill): batch too large, queueing
    if role == "prefill" and len(parsed) >= 2:
        before, windows = _ttft_windows(parsed)
        reference = before if before else (windows[0] if len(windows) >= 2 else None)
        stuck_found = any(f["signal"] == "vllm:num_requests_running" for f in findings)
        if windows and reference and windows[-1] >= ttft_growth * reference and stuck_found:
            findings.append(_finding(
                "info", "vllm:time_to_first_token_seconds",
                f"mean {windows[-1]:.3f} s in the last window vs {reference:.3f} s before",
                "TTFT grows because prompts queue behind the one running prefill",
                "fix the running-stuck-at-1 finding first; do not lower max-num-batched-tokens now", where))
        elif windows and reference and windows[-1] >= ttft_growth * reference:
            configured = eng["max_num_batched_tokens"]
            lower = next((level for level in BATCH_LEVELS if level < configured), None)
            if lower is None:
                action = (f"prefill.engine.max_num_batched_tokens {configured} is at the table's floor: "
                          f"add a prefill instance (prefill.instances: {rcfg['instances'] + 1})")
                change = {"param": "prefill.instances", "value": rcfg["instances"] + 1}
            else:
                action = f"lower prefill.engine.max_num_batched_tokens from {configured} to {lower}"
                if lower < 2 * avg:
                    action += (f" (below 2 x average prompt {2 * avg}: fewer prompts per step) or add a prefill "
                               f"instance (prefill.instances: {rcfg['instances'] + 1})")
                change = {"param": "prefill.engine.max_num_batched_tokens", "value": lower}
            findings.append(_finding(
                "warning", "vllm:time_to_first_token_seconds",
                f"mean {windows[-1]:.3f} s in the last window vs {reference:.3f} s before",
                "TTFT grows: the batch is too large and requests queue behind it (or the load grew)",
                action, where, change))

    if log_text is not None:
        lines = count_recompute(log_text)
        if lines and role == "decode":
            seqs = eng["max_num_seqs"]
            fewer = max(1, seqs * SEQS_STEP[0] // SEQS_STEP[1])
            if rcfg["offload_connector"] == "RecomputeCPUOffloadConnector":
                findings.append(_finding(
                    "info", "log: [RecomputeScheduler] Recompute triggered", lines,
                    "D ran out of KV and preempted requests; their KV was parked in CPU and restored",
                    f"none while rare; if frequent, lower decode.engine.max_num_seqs from {seqs} to {fewer}",
                    where))
            else:
                findings.append(_finding(
                    "warning", "log: [RecomputeScheduler] Recompute triggered", lines,
                    "D ran out of KV and preempted requests; without a CPU pool they are re-prefilled",
                    f"{_offload_hint(rcfg, role)}, or lower decode.engine.max_num_seqs from {seqs} to {fewer}",
                    where, {"param": "decode.engine.max_num_seqs", "value": fewer}))
        if _OOM_RE.search(clean_log(log_text if isinstance(log_text, str) else "\n".join(log_text))):
            if role == "prefill":
                configured = eng["max_num_batched_tokens"]
                lower = next((level for level in BATCH_LEVELS[1:] if level < configured), BATCH_LEVELS[-1])
                findings.append(_finding(
                    "critical", "log: out of memory", "an out-of-memory error in the log",
                    "P OOM: max-num-batched-tokens too large (activation memory)",
                    f"lower prefill.engine.max_num_batched_tokens from {configured} to {lower} (back to 24576 / 16384)",
                    where, {"param": "prefill.engine.max_num_batched_tokens", "value": lower}))
            else:
                findings.append(_finding(
                    "critical", "log: out of memory", "an out-of-memory error in the log",
                    "D OOM: KV and activations exceed HBM",
                    f"lower decode.engine.max_num_seqs from {eng['max_num_seqs']} to "
                    f"{max(1, eng['max_num_seqs'] * SEQS_STEP[0] // SEQS_STEP[1])}, or keep "
                    f"decode.engine.gpu_memory_utilization at 0.85 (now {eng['gpu_memory_utilization']})", where))
    return findings


def verdict(findings):
    """Sum up a cluster's findings: ``{status, critical, warning, info, actions, changes, message}``.

    ``status`` is the worst severity (``ok`` without findings); ``actions`` lists each distinct
    action once, worst first; ``changes`` the distinct one-parameter changes they propose.
    """
    where = "pd_verdict"
    if not isinstance(findings, (list, tuple)):
        raise PdError(where, "findings", f"{type(findings).__name__} is not a list", "pass pd_diagnose results")
    for i, f in enumerate(findings):
        if not isinstance(f, Mapping) or f.get("severity") not in SEVERITIES:
            raise PdError(where, f"findings[{i}]", "is not a finding with severity critical|warning|info",
                          "pass pd_diagnose results")
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITIES}
    status = next((s for s in SEVERITIES if counts[s]), "ok")
    ordered = sorted(findings, key=lambda f: SEVERITIES.index(f["severity"]))
    actions, changes = [], []
    for f in ordered:
        if f["action"] not in actions:
            actions.append(f["action"])
        if f.get("change") and f["change"] not in changes:
            changes.append(f["change"])
    if status == "ok":
        message = "OK: no signal of the pitfall table fired"
    else:
        message = (f"{status.upper()}: {counts['critical']} critical, {counts['warning']} warning(s), "
                   f"{counts['info']} note(s); first: {actions[0]}")
    return {"status": status, **counts, "actions": actions, "changes": changes, "message": message}


def _results_by_name(results):
    out = {}
    for res in results or []:
        item = res.get("item") if isinstance(res, Mapping) else None
        if isinstance(item, Mapping) and item.get("name"):
            out[item["name"]] = res
    return out


def _http_problem(res):
    """Short text for a failed uri result: "HTTP 503" or "no answer (Connection refused)"."""
    status = (res or {}).get("status")
    if isinstance(status, int) and status > 0:
        return f"HTTP {status}"
    msg = str((res or {}).get("msg") or "connection failed")
    reason = re.search(r"\[Errno \d+\] ([^>]+)|(timed out)", msg)
    return f"no answer ({next(g for g in reason.groups() if g) if reason else msg})"


def _scraped(res):
    """(metrics dict or None, problem text or None) of one uri result."""
    if res is None or res.get("skipped"):
        return None, "not scraped"
    if res.get("status") != 200:
        return None, _http_problem(res)
    try:
        return parse_metrics(res.get("content") or ""), None
    except PdError as exc:
        return None, exc.problem


def health_ranks(specs, first_results, second_results, log_results=None, config=None, proxy=None,
                 proxy_result=None, kv_high=KV_HIGH, sustain=KV_SUSTAIN, mid_results=None):
    """Per-rank health of one host from the health check's Ansible loop results.

    ``specs``: this host's engine launch specs; ``first_results`` / ``second_results``: the ``.results``
    of the two ``uri`` loops over them (GET /metrics, return_content); ``log_results``: the ranks' logs,
    ``{name: text}`` (``pd_docker_logs``) or a ``uri`` loop with text content (optional); ``config``:
    the host's ``pd_cluster``; ``proxy`` / ``proxy_result``:
    the host's proxy spec and its /healthcheck answer (optional); ``mid_results``: a scrape taken
    between the two, under load (optional).

    Returns ``[{name, cluster, role, host, port, reachable, samples, window, peak, recompute_lines,
    findings, verdict}]``; ``window`` is first -> last scrape, ``peak`` the largest running / waiting /
    KV usage seen in any scrape. A rank that does not answer /metrics is a critical finding.
    """
    where = "pd_health_ranks"
    if not isinstance(specs, list):
        raise PdError(where, "specs", f"{type(specs).__name__} is not a list", "pass the host's launch specs")
    first, second = _results_by_name(first_results), _results_by_name(second_results)
    mid = _results_by_name(mid_results)
    if isinstance(log_results, Mapping):
        logs = {name: text for name, text in log_results.items() if isinstance(text, str)}
    else:
        logs = {name: res.get("content") for name, res in _results_by_name(log_results).items()
                if res.get("status") == 200 and isinstance(res.get("content"), str)}
    out = []
    for spec in specs:
        name = spec["name"]
        rank_where = f"{spec['cluster']}/{spec['role']} {name}"
        samples, problems = [], []
        for res in (first.get(name), mid.get(name), second.get(name)):
            parsed, problem = _scraped(res)
            if parsed is not None:
                samples.append(parsed)
            elif problem != "not scraped":
                problems.append(problem)
        log_text = logs.get(name)
        findings = []
        if problems or not samples:
            findings.append(_finding(
                "critical", "GET /metrics", "; ".join(problems) or "no answer",
                "the rank is down or not serving", f"read its log (playbooks/collect-logs.yml), then "
                f"playbooks/deploy-pd.yml --limit {spec['cluster']}", rank_where))
        else:  # judge the signals only over a complete window (a lone sample misreads counters)
            findings.extend(diagnose(samples, spec["role"], config, log_text=log_text, where=rank_where,
                                     kv_high=kv_high, sustain=sustain))
        out.append({
            "name": name, "cluster": spec["cluster"], "role": spec["role"], "host": spec.get("host"),
            "port": (spec.get("ports") or {}).get("http"), "reachable": bool(samples) and not problems,
            "samples": samples,
            "window": metrics_window(samples[0], samples[-1]) if len(samples) >= 2 else None,
            "peak": {key: max((s[key] for s in samples if s[key] is not None), default=None)
                     for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")},
            "recompute_lines": count_recompute(log_text) if log_text is not None else None,
            "findings": findings, "verdict": verdict(findings),
        })
    if proxy:
        status = (proxy_result or {}).get("status")
        findings = []
        if status != 200:
            shown = _http_problem(proxy_result)
            findings.append(_finding(
                "critical", "GET /healthcheck", shown, "the PD proxy is down: no request is served",
                f"playbooks/deploy-pd.yml --limit {proxy['cluster']} re-creates it; its log: playbooks/collect-logs.yml",
                f"{proxy['cluster']}/proxy {proxy['name']}"))
        out.append({"name": proxy["name"], "cluster": proxy["cluster"], "role": "proxy", "host": proxy.get("host"),
                    "port": (proxy.get("ports") or {}).get("http"), "reachable": status == 200, "samples": [],
                    "window": None, "peak": None, "recompute_lines": None, "findings": findings,
                    "verdict": verdict(findings)})
    return out


def health_clusters(ranks):
    """Group per-rank health (``health_ranks`` of every host, flattened) by cluster, with a verdict each.

    Returns ``{cluster: {cluster, verdict, findings, ranks, lines}}``; ``lines`` is what the playbook
    prints: the verdict, then one line per finding with its concrete action.
    """
    where = "pd_health_clusters"
    if not isinstance(ranks, (list, tuple)):
        raise PdError(where, "ranks", f"{type(ranks).__name__} is not a list", "pass pd_health_ranks results")
    out = {}
    for rank in ranks:
        if isinstance(rank, (list, tuple)):
            raise PdError(where, "ranks", "nested list", "flatten the per-host lists first (| flatten(1))")
        entry = out.setdefault(rank["cluster"], {"cluster": rank["cluster"], "ranks": [], "findings": []})
        entry["ranks"].append(rank)
        entry["findings"].extend(rank["findings"])
    for name, entry in out.items():
        entry["verdict"] = verdict(entry["findings"])
        lines = [f"{name}: {entry['verdict']['message']}"]
        for f in sorted(entry["findings"], key=lambda f: SEVERITIES.index(f["severity"])):
            lines.append(f"  [{f['severity']}] {f['where']}: {f['signal']} = {f['value']} — {f['meaning']}")
            lines.append(f"      do: {f['action']}")
        entry["lines"] = lines
    return out


def metrics_summary(ranks, load=None):
    """Per-role totals of a measurement window over ranks (``health_ranks`` entries with a window).

    Per role: ``running`` / ``waiting`` (sums over ranks of each rank's peak, i.e. under load when a
    scrape was taken under load; else at the last scrape), ``kv_cache_usage_perc`` (max),
    ``preemptions`` (increase), ``requests``, ``ttft_mean`` / ``ttft_p50`` / ``ttft_p95`` (merged
    histogram of the window), ``generation_tokens``. ``load`` (the load script's result) is copied
    under ``load``: its ``throughput_tokens_per_s`` is the client's view.
    """
    out = {}
    for rank in ranks or []:
        window = rank.get("window")
        if not window or rank.get("role") not in model.ROLES:
            continue
        role = out.setdefault(rank["role"], {"ranks": 0, "running": 0.0, "waiting": 0.0, "kv_cache_usage_perc": None,
                                             "preemptions": 0.0, "requests": 0.0, "generation_tokens": 0.0,
                                             "_ttft_sum": 0.0, "_buckets": {}})
        gauges = rank.get("peak") or window
        role["ranks"] += 1
        role["running"] += gauges["num_requests_running"] or 0.0
        role["waiting"] += gauges["num_requests_waiting"] or 0.0
        if gauges["kv_cache_usage_perc"] is not None:
            role["kv_cache_usage_perc"] = max(role["kv_cache_usage_perc"] or 0.0, gauges["kv_cache_usage_perc"])
        role["preemptions"] += window["preemptions"] or 0.0
        role["requests"] += window["requests"] or 0.0
        role["generation_tokens"] += window["generation_tokens"] or 0.0
        if window["ttft_mean"] is not None and window["requests"]:
            role["_ttft_sum"] += window["ttft_mean"] * window["requests"]
        for le, count in (window.get("ttft_buckets") or {}).items():
            role["_buckets"][le] = role["_buckets"].get(le, 0.0) + count
    for role in out.values():
        pairs = sorted(((_le_value(le), c) for le, c in role.pop("_buckets").items()), key=lambda p: p[0])
        ttft_sum = role.pop("_ttft_sum")
        role["ttft_mean"] = ttft_sum / role["requests"] if role["requests"] else None
        role["ttft_p50"], role["ttft_p95"] = _quantile(pairs, 0.5), _quantile(pairs, 0.95)
    if load is not None:
        out["load"] = load
    return out


# ---------------------------------------------------------------------------------------------------
# token gate

_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")


def _choice_token_ids(choice):
    """Token ids of a completion choice when the server returned them, else None."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    tokens = ((choice.get("logprobs") or {}) if isinstance(choice.get("logprobs"), Mapping) else {}).get("tokens")
    if isinstance(tokens, list) and tokens:
        matches = [_TOKEN_ID_RE.match(t) if isinstance(t, str) else None for t in tokens]
        if all(matches):
            return [int(m.group(1)) for m in matches]
    return None


def gate_answers(results):
    """Answers of a token-gate run from the ``uri`` loop over the prompts (one POST each).

    Returns ``[{text, token_ids}]`` in prompt order: ``choices[0].text`` (or ``message.content`` of a
    chat completion) and the token ids when the server returned them (``choices[0].token_ids``, or
    ``logprobs.tokens`` as ``token_id:N`` strings), else None. Any failed request raises ``PdError``
    naming the prompt and the answer.
    """
    where = "pd_gate_answers"
    if not isinstance(results, (list, tuple)):
        raise PdError(where, "results", f"{type(results).__name__} is not a list", "pass the uri loop's .results")
    out, failed = [], []
    for index, res in enumerate(results):
        body = res.get("json") if isinstance(res, Mapping) else None
        choices = body.get("choices") if isinstance(body, Mapping) else None
        if not isinstance(res, Mapping) or res.get("status") != 200 or not choices:
            status = res.get("status") if isinstance(res, Mapping) else None
            detail = (res.get("msg") or "") if isinstance(res, Mapping) else ""
            failed.append(f"prompt {index}: HTTP {status} {detail}".strip())
            continue
        choice = choices[0]
        text = choice.get("text")
        if text is None:
            text = (choice.get("message") or {}).get("content")
        out.append({"text": text if isinstance(text, str) else "", "token_ids": _choice_token_ids(choice)})
    if failed:
        raise PdError(where, "results", f"{len(failed)} request(s) failed: {'; '.join(failed[:5])}",
                      "the endpoint must answer every prompt; check it with the health check first")
    return out


def _answers(side, name, where):
    """(answers, prompts or None, settings or None) of one side of the gate."""
    prompts = settings = None
    if isinstance(side, Mapping):
        prompts, settings = side.get("prompts"), side.get("settings")
        side = side.get("answers")
    if not isinstance(side, (list, tuple)):
        raise PdError(where, name, f"{type(side).__name__} is not a list of answers",
                      "pass one answer per prompt (text, token id list, or {text, token_ids}) or a gate record")
    return list(side), prompts, settings


def _unit(answer, where, name, index):
    """(kind, sequence) of one answer: token ids when present, else the text."""
    if isinstance(answer, Mapping):
        ids = answer.get("token_ids")
        if isinstance(ids, list):
            return "token_ids", ids
        answer = answer.get("text")
    if isinstance(answer, str):
        return "text", answer
    if isinstance(answer, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in answer):
        return "token_ids", list(answer)
    raise PdError(where, f"{name}[{index}]", f"{type(answer).__name__} is not an answer",
                  "give the generated text, a list of token ids or {text, token_ids}")


def token_gate(a, b):
    """Token-level correctness gate: the same prompts, greedy, must give identical output.

    ``a`` and ``b`` are lists with one answer per prompt (generated text, a list of token ids, or
    ``{text, token_ids}``), or gate records ``{prompts, settings, answers}`` (then their prompts and
    settings must be equal). Token ids are compared when both answers have them, else the texts
    (position = character index).

    Returns ``{passed, prompts, compared_by, mismatches}``; each mismatch is ``{prompt_index,
    first_diverging_position, unit, a_token, b_token, a_excerpt, b_excerpt}`` (a token is None where
    that answer already ended).
    """
    where = "pd_token_gate"
    answers_a, prompts_a, settings_a = _answers(a, "a", where)
    answers_b, prompts_b, settings_b = _answers(b, "b", where)
    if len(answers_a) != len(answers_b):
        raise PdError(where, "b", f"{len(answers_b)} answers against {len(answers_a)}",
                      "run both sides with the same prompt set")
    if prompts_a is not None and prompts_b is not None and prompts_a != prompts_b:
        raise PdError(where, "prompts", "the two records were made with different prompt sets",
                      "record both with the same files/token-gate-prompts.yml")
    if settings_a is not None and settings_b is not None and settings_a != settings_b:
        raise PdError(where, "settings", f"different request settings: {settings_a} vs {settings_b}",
                      "record both with the same max_tokens / temperature / seed")
    mismatches, kinds = [], []
    for index, (x, y) in enumerate(zip(answers_a, answers_b)):
        kind_a, seq_a = _unit(x, where, "a", index)
        kind_b, seq_b = _unit(y, where, "b", index)
        if kind_a != kind_b:
            kind_a = kind_b = "text"
            seq_a, seq_b = _unit(x.get("text") if isinstance(x, Mapping) else x, where, "a", index)[1], \
                _unit(y.get("text") if isinstance(y, Mapping) else y, where, "b", index)[1]
        kinds.append(kind_a)
        if seq_a == seq_b:
            continue
        pos = next((i for i, (p, q) in enumerate(zip(seq_a, seq_b)) if p != q), min(len(seq_a), len(seq_b)))
        mismatches.append({
            "prompt_index": index,
            "first_diverging_position": pos,
            "unit": "token" if kind_a == "token_ids" else "character",
            "a_token": seq_a[pos] if pos < len(seq_a) else None,
            "b_token": seq_b[pos] if pos < len(seq_b) else None,
            "a_excerpt": seq_a[max(0, pos - 10):pos + 20] if kind_a == "text" else seq_a[max(0, pos - 3):pos + 5],
            "b_excerpt": seq_b[max(0, pos - 10):pos + 20] if kind_a == "text" else seq_b[max(0, pos - 3):pos + 5],
        })
    return {"passed": not mismatches, "prompts": len(answers_a), "compared_by": kinds, "mismatches": mismatches}


def gate_message(result, label_a="A", label_b="B"):
    """Readable lines of a ``token_gate`` result (the playbook's failure message)."""
    head = (f"token gate {label_a} vs {label_b}: "
            + ("PASSED" if result["passed"] else f"FAILED on {len(result['mismatches'])} of {result['prompts']} prompt(s)"))
    lines = [head]
    for m in result["mismatches"]:
        lines.append(f"  prompt {m['prompt_index']}: first difference at {m['unit']} {m['first_diverging_position']}: "
                     f"{label_a} {m['a_token']!r} vs {label_b} {m['b_token']!r} "
                     f"({label_a} ...{m['a_excerpt']!r}... / {label_b} ...{m['b_excerpt']!r}...)")
    return lines


# ---------------------------------------------------------------------------------------------------
# one change at a time

_MISSING = object()
_RAW_NAMES = {"cpu_offload_bytes": "cpu_offload", "shm_size_bytes": "shm_size"}


def _leaf_changes(old, new, path, out):
    if isinstance(old, Mapping) or isinstance(new, Mapping):
        if (old is _MISSING or isinstance(old, Mapping)) and (new is _MISSING or isinstance(new, Mapping)):
            left = {} if old is _MISSING else old
            right = {} if new is _MISSING else new
            for key in sorted(set(left) | set(right), key=str):
                _leaf_changes(left.get(key, _MISSING), right.get(key, _MISSING),
                              f"{path}.{key}" if path else str(key), out)
            return
    # compare values, not exact types: Ansible hands over tagged str/int/dict subclasses; only a bool
    # against a number (True == 1) is a real difference that == hides
    if old is _MISSING or new is _MISSING or isinstance(old, bool) != isinstance(new, bool) or old != new:
        out.append({"path": path,
                    "old": None if old is _MISSING else old,
                    "new": None if new is _MISSING else new,
                    "kind": "added" if old is _MISSING else "removed" if new is _MISSING else "changed"})


def _raw_path(path):
    """Normalized-cluster path -> the pd_cluster key an operator edits (roles.decode.cpu_offload_bytes ->
    decode.cpu_offload)."""
    parts = path.split(".")
    if parts[0] == "roles" and len(parts) >= 2:
        parts = parts[1:]
    return ".".join(_RAW_NAMES.get(p, p) for p in parts)


def diff_paths(before, after, effective=True):
    """Every changed leaf between two ``pd_cluster`` dicts: ``[{path, old, new, kind}]``.

    With ``effective`` (default) both are normalized first (defaults merged, sizes in bytes), so an
    explicit default or "200 GiB" for "200GiB" is no change; paths are given as the pd_cluster keys
    an operator edits (``prefill.engine.max_num_batched_tokens``, ``decode.cpu_offload``).
    """
    where = "pd_one_change"
    for name, side in (("before", before), ("after", after)):
        if not isinstance(side, Mapping):
            raise PdError(where, name, f"{type(side).__name__} is not a pd_cluster dict",
                          "pass the applied pd_cluster and the edited one")
    changes = []
    if effective:
        _leaf_changes(_normalized(before, where), _normalized(after, where), "", changes)
        for change in changes:
            change["path"] = _raw_path(change["path"])
    else:
        _leaf_changes(before, after, "", changes)
    return changes


def one_change(before, after, effective=True):
    """The single parameter that differs between two ``pd_cluster`` dicts: ``{path, old, new, kind}``.

    Tuning changes exactly one parameter at a time (article §6); anything else raises ``PdError``
    that lists every changed path (or says nothing changed). See ``diff_paths`` for ``effective``.
    """
    changes = diff_paths(before, after, effective)
    if len(changes) == 1:
        return changes[0]
    if not changes:
        raise PdError("pd_one_change", "pd_cluster", "nothing changed against the applied configuration",
                      "edit exactly one parameter in group_vars/<cluster>.yml, then run again")
    shown = "; ".join(f"{c['path']}: {c['old']!r} -> {c['new']!r}" for c in changes)
    raise PdError("pd_one_change", "pd_cluster", f"{len(changes)} parameters changed ({shown})",
                  "tuning changes exactly one parameter at a time: revert all but one and run again")


def tune_check(change, param, value):
    """Check that ``one_change``'s result is the change the operator declared (``-e pd_tune_param=..
    -e pd_tune_value=..``); returns the change. ``value`` may be a string as extra vars give it
    ("32768", "true", "200GiB"): it is read as YAML, and sizes are compared in bytes."""
    where = "pd_tune_check"
    if not isinstance(change, Mapping) or "path" not in change:
        raise PdError(where, "change", "is not a pd_one_change result", "pass pd_one_change's result")
    if not isinstance(param, str) or not param:
        raise PdError(where, "pd_tune_param", f"{param!r} is not a parameter path",
                      "give the path you changed, e.g. -e pd_tune_param=prefill.engine.max_num_batched_tokens")
    if change["path"] != param:
        raise PdError(where, "pd_tune_param", f"you declared {param} but the changed parameter is "
                      f"{change['path']} ({change['old']!r} -> {change['new']!r})",
                      "declare the parameter you edited, or revert the edit")
    wanted = yaml.safe_load(value) if isinstance(value, str) else value
    got = change["new"]
    if param.rsplit(".", 1)[-1] in ("cpu_offload", "shm_size") and wanted is not None:
        wanted = sizes.to_bytes(wanted, field="pd_tune_value", where=where)
    if isinstance(got, bool) != isinstance(wanted, bool) or got != wanted:
        raise PdError(where, "pd_tune_value", f"you declared {value!r} but group_vars set {param} to {got!r}",
                      "make group_vars and -e pd_tune_value agree")
    return dict(change)


def spec_hashes(plan, cluster):
    """``{host: {container name: pd.spec-hash}}`` of a cluster's engine ranks and proxy in a fleet plan."""
    where = "pd_spec_hashes"
    if not isinstance(plan, Mapping) or cluster not in (plan.get("clusters") or {}):
        raise PdError(where, "cluster", f"{cluster!r} is not a cluster of the plan",
                      f"use one of {', '.join(sorted((plan or {}).get('clusters') or {}))}")
    out = {}
    for host in plan["clusters"][cluster]["hosts"]:
        out[host] = {spec["name"]: spec["labels"]["pd.spec-hash"] for spec in plan["hosts"][host]["specs"]}
    proxy = plan["clusters"][cluster].get("proxy")
    if proxy:
        out.setdefault(proxy["host"], {})[proxy["name"]] = proxy["labels"]["pd.spec-hash"]
    return out


def running_drift(expected, info_results):
    """Problems between recorded spec hashes and the running containers (docker_container_info loop).

    ``expected`` is ``{name: hash}``; ``info_results`` the ``.results`` of docker_container_info looped
    over those names. Returns one message per container that is absent, stopped or runs another spec.
    """
    where = "pd_running_drift"
    if not isinstance(expected, Mapping):
        raise PdError(where, "expected", f"{type(expected).__name__} is not a mapping", "pass {name: spec hash}")
    seen = {}
    for res in info_results or []:
        seen[res.get("item")] = res
    out = []
    for name, digest in expected.items():
        res = seen.get(name)
        container = (res or {}).get("container") or {}
        if not res or not res.get("exists"):
            out.append(f"{name}: not present")
            continue
        if not (container.get("State") or {}).get("Running"):
            out.append(f"{name}: not running")
        label = ((container.get("Config") or {}).get("Labels") or {}).get("pd.spec-hash")
        if label != digest:
            out.append(f"{name}: runs spec {str(label)[:12]} but {digest[:12]} was recorded")
    return out


def tune_record(change, before, after, cluster):
    """One line of build/reports/<cluster>/tune-history.jsonl: the change and its before/after numbers.

    ``before`` / ``after`` are ``metrics_summary`` results (per role, plus ``load``).
    """
    if not isinstance(change, Mapping) or "path" not in change:
        raise PdError("pd_tune_record", "change", "is not a pd_one_change result", "pass pd_tune_check's result")

    def headline(summary):
        summary = summary or {}
        load = summary.get("load") or {}
        return {
            "prefill_running": (summary.get("prefill") or {}).get("running"),
            "prefill_waiting": (summary.get("prefill") or {}).get("waiting"),
            "decode_running": (summary.get("decode") or {}).get("running"),
            "preemptions": sum((summary.get(r) or {}).get("preemptions") or 0.0 for r in model.ROLES),
            "ttft_p50_s": (summary.get("prefill") or {}).get("ttft_p50"),
            "ttft_p95_s": (summary.get("prefill") or {}).get("ttft_p95"),
            "client_ttft_p50_s": load.get("ttft_p50_s"),
            "throughput_tokens_per_s": load.get("throughput_tokens_per_s"),
            "requests_ok": load.get("ok"),
            "requests_failed": load.get("failed"),
        }
    return {"cluster": cluster, "param": change["path"], "old": change["old"], "new": change["new"],
            "before": headline(before), "after": headline(after), "detail": {"before": before, "after": after}}


# ---------------------------------------------------------------------------------------------------
# baseline: bare engines at two max-model-len values

_DROP_FLAGS = ("--kv-transfer-config", "--additional-config")


def baseline_spec(spec, max_model_len):
    """The bare-engine launch spec derived from a rank's spec for the KV baseline (article §6 step 2).

    Same image, devices, mounts, env and flags, except: no ``--kv-transfer-config`` and no
    ``--additional-config`` (no connector, no recompute scheduler), ``--max-model-len`` set to
    ``max_model_len``, container ``<name>-baseline``, no pinned offload, no restart policy, labels
    ``pd.baseline=true`` (stop-pd.yml still finds it by ``pd.managed-by``).
    """
    where = "pd_baseline_spec"
    if not isinstance(spec, Mapping) or spec.get("kind") != "engine":
        raise PdError(where, "spec", "is not an engine launch spec", "pass one spec of plan.hosts[host].specs")
    sizes.check_int(max_model_len, "max_model_len", where, minimum=1)
    command, skip = [], False
    for arg in spec["command"]:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _DROP_FLAGS:
            skip = "=" not in arg
            continue
        if flag == "--max-model-len":
            skip = "=" not in arg
            continue
        command.append(arg)
    insert = command.index("--tensor-parallel-size") + 2 if "--tensor-parallel-size" in command else len(command)
    command[insert:insert] = ["--max-model-len", str(max_model_len)]
    out = copy.deepcopy(dict(spec))
    out.update({
        "name": f"{spec['name']}-baseline",
        "command": command,
        "pinned_offload_bytes": 0,
        "restart_policy": "no",
        "baseline_of": spec["name"],
        "max_model_len": max_model_len,
        "labels": {"pd.cluster": spec["cluster"], "pd.role": spec["role"], "pd.managed-by": "pd-deploy",
                   "pd.baseline": "true", "pd.baseline-max-model-len": str(max_model_len)},
    })
    return out


def baseline_boots(bare_specs, logs, max_model_len):
    """Boots for ``baseline_report`` from the bare-engine specs and their logs ``{name: text}``.

    Returns ``[{name, role, max_model_len, log_text}]``; ``name`` is the rank the bare engine stands
    for. A missing log raises ``PdError`` naming the container.
    """
    where = "pd_baseline_boots"
    sizes.check_int(max_model_len, "max_model_len", where, minimum=1)
    if not isinstance(logs, Mapping):
        raise PdError(where, "logs", f"{type(logs).__name__} is not {{name: log text}}", "pass pd_docker_logs' result")
    out = []
    for spec in bare_specs or []:
        text = logs.get(spec["name"])
        if not isinstance(text, str):
            raise PdError(where, spec["name"], "its log could not be read",
                          "check the Docker socket (pd_ops_docker_socket) and that the container existed")
        out.append({"name": spec.get("baseline_of", spec["name"]), "role": spec.get("role"),
                    "max_model_len": max_model_len, "log_text": clean_log(text)})
    return out


def baseline_failure(unhealthy, logs, host):
    """The failure message for bare engines that never answered their health URL (with log tails).

    ``logs`` is ``{name: text}`` (``pd_docker_logs``)."""
    logs = logs if isinstance(logs, Mapping) else {}
    lines = [f"{host}: {len(unhealthy)} bare engine(s) never became healthy; they were removed and no "
             "baseline was recorded for this host."]
    for spec in unhealthy:
        lines.append(f"- {spec['name']} (max-model-len {spec.get('max_model_len')}, {spec['health_url']}):")
        tail = log_tail(logs.get(spec["name"]))
        if tail:
            lines.append(tail)
    lines.append("A max-model-len whose KV does not fit one request fails at start-up: choose smaller "
                 "pd_ops_baseline_lengths, or check the devices with playbooks/deploy-pd.yml's prechecks.")
    return "\n".join(lines)


def image_identity(image):
    """``{tags, id, digests, created, labels}`` of one docker_image_info image (what was measured)."""
    if not isinstance(image, Mapping):
        raise PdError("pd_image_identity", "image", f"{type(image).__name__} is not image info",
                      "pass one item of docker_image_info's images")
    return {"tags": image.get("RepoTags") or [], "id": image.get("Id"), "digests": image.get("RepoDigests") or [],
            "created": image.get("Created"), "labels": (image.get("Config") or {}).get("Labels") or {}}


def _boot(boot, index, where):
    if not isinstance(boot, Mapping) or "log_text" not in boot:
        raise PdError(where, f"boots[{index}]", "is not a boot", "give {max_model_len, log_text[, name, role]}")
    parsed = logparse.parse_startup_log(boot["log_text"])
    length = boot.get("max_model_len", parsed["concurrency_len"])
    sizes.check_int(length, f"boots[{index}].max_model_len", where, minimum=1)
    if parsed["concurrency_len"] != length:
        raise PdError(where, f"boots[{index}].max_model_len",
                      f"the log reports concurrency for {parsed['concurrency_len']} tokens, not {length}",
                      "pass the log of the boot at that max-model-len")
    return length, parsed


def _judge_with_cause(value, band):
    judged = logparse.judge_bytes_per_token(value, band)
    causes = {
        "ok": None,
        "low": "the band is for another model or unit, or the log is another model's",
        "high": "a wider KV cache dtype than the band assumes (bf16 vs 8/4-bit) or another checkpoint; "
                "for a single ratio: the fixed per-request part at a short max-model-len",
        "far_high": "the hybrid KV cache manager is off (--disable-hybrid-kv-cache-manager, or a KV connector "
                    "that disables it: keep --no-disable-hybrid-kv-cache-manager) — KV compression is lost",
    }
    judged["likely_cause"] = causes[judged["verdict"]]
    return judged


def baseline_report(boots, band=None, family=None, config=None):
    """KV footprint of a cluster from bare-engine boots at two max-model-len values (DOMAIN.md §5).

    ``boots``: ``[{max_model_len, log_text, name?, role?}]``, one per rank and length (the ranks'
    start-up logs). ``band``: ``{min, max, source}`` override of pd_deploy/data/models.yml's band for
    ``family``; ``config``: the cluster's ``pd_cluster`` (adds its P99 request length and
    configured max-model-len to the tables).

    Returns ``{boots, fits, verdict, band}``:
    - per boot: the article's single ratio (available / tokens), KV tokens per DP group (= per
      engine, as printed), per-request footprint and the start-up "one request needs ~X"
      reservation (max_model_len x single ratio);
    - per role (``all`` when boots carry no role): the two-point fit (marginal bytes per token,
      fixed bytes per request) through the worst (largest) footprint at the shortest and longest
      length, judged against the band; at the configured max-model-len and the P99 request length
      the true footprint from the fit against the article's estimate (length x single ratio), the
      requests and tokens that fit one worker's KV at P99;
    - ``verdict``: the worst judgement, with its likely cause.
    """
    where = "pd_baseline_report"
    if not isinstance(boots, (list, tuple)) or not boots:
        raise PdError(where, "boots", "no boots", "pass the start-up logs of the bare engines at two max-model-len values")
    cluster = _normalized(config, where) if config is not None else None
    fam = family or ((cluster or {}).get("model") or {}).get("family")
    band = model_band(fam, band)
    rows = []
    for index, boot in enumerate(boots):
        length, parsed = _boot(boot, index, where)
        rows.append({
            "name": boot.get("name"), "role": boot.get("role"), "max_model_len": length,
            "available_bytes": parsed["available_bytes"], "kv_tokens_per_dp_group": parsed["tokens"],
            "max_concurrency": parsed["max_concurrency"], "workers": parsed["workers"],
            "bytes_per_token": parsed["bytes_per_token"], "per_request_bytes": parsed["per_request_bytes"],
            "startup_reservation_bytes": round(length * parsed["bytes_per_token"]),
            "judge": _judge_with_cause(parsed["bytes_per_token"], band),
        })
    fits = {}
    for role in sorted({r["role"] or "all" for r in rows}):
        mine = [r for r in rows if (r["role"] or "all") == role]
        lengths = sorted({r["max_model_len"] for r in mine})
        entry = {"lengths": lengths}
        if len(lengths) < 2:
            entry["fit"] = None
            entry["note"] = "one max-model-len only: boot again at a second length for the two-point fit"
            fits[role] = entry
            continue
        worst = {L: max((r for r in mine if r["max_model_len"] == L), key=lambda r: r["per_request_bytes"])
                 for L in (lengths[0], lengths[-1])}
        fit = logparse.two_point_fit(*worst.values())
        entry["fit"] = fit
        entry["judge"] = _judge_with_cause(fit["marginal_bytes_per_token"], band)
        available = min(r["available_bytes"] for r in mine if r["max_model_len"] == lengths[-1])
        entry["available_bytes_per_worker"] = available
        entry["kv_tokens_marginal_only"] = int(available // max(fit["marginal_bytes_per_token"], 1e-9))
        if len(lengths) > 2:
            entry["note"] = f"fitted through {lengths[0]} and {lengths[-1]}; middle lengths not used"
        targets = {}
        if cluster is not None:
            rname = role if role in model.ROLES else "decode"
            targets["configured max_model_len"] = cluster["roles"][rname]["engine"]["max_model_len"]
            targets["P99 request (prompt + output)"] = p99_request_len(cluster)
            targets["average prompt"] = cluster["workload"]["avg_prompt_tokens"]
        else:
            targets["longest boot"] = lengths[-1]
        ratio_at = {r["max_model_len"]: r["bytes_per_token"] for r in mine}
        requests = []
        for label, length in targets.items():
            nearest = min(ratio_at, key=lambda L: abs(L - length))
            true = logparse.footprint_at(fit, length)
            article = round(length * ratio_at[nearest])
            requests.append({
                "what": label, "tokens": length, "true_bytes": true,
                "article_estimate_bytes": article, "single_ratio_from_boot_at": nearest,
                "requests_per_worker": int(available // true) if true else None,
                "tokens_per_worker": int(available // true) * length if true else None,
            })
        entry["requests"] = requests
        fits[role] = entry
    judged = [f["judge"] for f in fits.values() if f.get("judge")] or [r["judge"] for r in rows]
    order = ("far_high", "high", "low", "ok")
    worst = min(judged, key=lambda j: order.index(j["verdict"]))
    basis = "two-point fit (marginal bytes per token)" if any(f.get("judge") for f in fits.values()) \
        else "single ratio (one length only: only a hint)"
    return {"boots": rows, "fits": fits, "band": band, "family": fam or DEFAULT_FAMILY,
            "verdict": {"verdict": worst["verdict"], "basis": basis, "message": worst["message"],
                        "likely_cause": worst["likely_cause"]}}


def _h(n):
    return sizes.to_human(int(n)) if n else "0"


def baseline_markdown(report, cluster_name=None, versions=None):
    """A ``baseline_report`` as Markdown (build/reports/<cluster>/baseline.md)."""
    if not isinstance(report, Mapping) or "boots" not in report:
        raise PdError("pd_baseline_markdown", "report", "is not a baseline report", "pass pd_baseline_report's result")
    v = report["verdict"]
    lines = [f"# KV baseline{' of ' + cluster_name if cluster_name else ''}", ""]
    for key, value in (versions or {}).items():
        if key == "images" and isinstance(value, list):
            for image in value:
                image = image if isinstance(image, Mapping) else {"id": image}
                lines.append(f"- image: {', '.join(image.get('tags') or []) or '-'} (id {image.get('id')}; "
                             f"digests {', '.join(image.get('digests') or []) or 'none (built locally?)'})")
        else:
            lines.append(f"- {key}: {value}")
    if versions:
        lines.append("")
    lines += [f"**Verdict: {v['verdict']}** ({v['basis']}): {v['message']}", ""]
    if v.get("likely_cause"):
        lines += [f"Likely cause: {v['likely_cause']}.", ""]
    band = report["band"]
    lines += [f"Expected band ({report['family']}): {band['min']}..{band['max']} bytes/token per worker — {band['source']}", "",
              "## Boots (bare engine, no KV connector)", "",
              "| rank | max-model-len | available KV / worker | KV tokens / DP group | max concurrency | "
              "single ratio (article) | per-request footprint | start-up reservation |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["boots"]:
        lines.append(f"| {r['name'] or '-'} | {r['max_model_len']} | {_h(r['available_bytes'])} | "
                     f"{r['kv_tokens_per_dp_group']:,} | {r['max_concurrency']:.2f}x | {r['bytes_per_token']:.0f} B/token | "
                     f"{_h(r['per_request_bytes'])} | {_h(r['startup_reservation_bytes'])} |")
    for role, entry in report["fits"].items():
        lines += ["", f"## Two-point fit: {role}", ""]
        if not entry.get("fit"):
            lines.append(entry.get("note", "no fit"))
            continue
        fit = entry["fit"]
        lines += [f"- marginal: **{fit['marginal_bytes_per_token']:.0f} bytes/token** per worker "
                  f"({entry['judge']['verdict']} against {band['min']}..{band['max']}"
                  + (f"; likely cause: {entry['judge']['likely_cause']}" if entry['judge'].get('likely_cause') else "")
                  + ")",
                  f"- fixed per request: {_h(fit['fixed_bytes_per_request'])}",
                  f"- KV of one worker {_h(entry['available_bytes_per_worker'])} holds "
                  f"{entry['kv_tokens_marginal_only']:,} tokens at the marginal rate alone", "",
                  "| request | tokens | true footprint (fit) | article estimate (tokens x single ratio) | "
                  "requests per worker | tokens per worker |", "| --- | --- | --- | --- | --- | --- |"]
        for q in entry["requests"]:
            lines.append(f"| {q['what']} | {q['tokens']} | {_h(q['true_bytes'])} | {_h(q['article_estimate_bytes'])} "
                         f"(ratio at {q['single_ratio_from_boot_at']}) | {q['requests_per_worker']} | "
                         f"{q['tokens_per_worker']:,} |")
        if entry.get("note"):
            lines += ["", entry["note"]]
    lines += ["", "The start-up \"one request needs ~X\" is max-model-len x single ratio: a worst-case "
              "reservation at max-model-len. Plan with the fit; set max-model-len to the P99 request."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# capacity report

def _bytes_model(baseline, role, family):
    """(marginal, fixed, source, measured) for a role: the baseline's fit, else models.yml's estimate."""
    fits = (baseline or {}).get("fits") or {}
    entry = fits.get(role) or fits.get("all")
    if entry and entry.get("fit"):
        fit = entry["fit"]
        return (fit["marginal_bytes_per_token"], fit["fixed_bytes_per_request"],
                "measured: playbooks/baseline.yml two-point fit", True)
    est = model_estimate(family)
    return (est["marginal_bytes_per_token"], est["fixed_bytes_per_request"],
            f"configured estimate: pd_deploy/data/models.yml ({est['source']})", False)


def capacity_report(summary, baseline=None, config=None):
    """Capacity of one cluster: KV budget, tokens and requests that fit, P and D concurrency, offload.

    ``summary``: the cluster's entry of the fleet plan (``plan.clusters[<name>]``, with ``capacity``);
    ``baseline``: a ``baseline_report`` (its fit is used when present, else the configured estimate
    of pd_deploy/data/models.yml, and the report says which); ``config``: the cluster's ``pd_cluster``
    (workload and engine values; the defaults' workload without it).

    Per role: KV budget per host / per DP group / per worker (group / TP), the footprint of a P99
    request (D: prompt + output; P: prompt), requests and tokens that fit one DP group, and:
    prefill: expected concurrency at the configured and the recommended max-num-batched-tokens;
    decode: memory at the configured concurrency (max_num_seqs x DP x footprint at P99) against the
    budget, and the max_num_seqs that fits. Offload pool, shm and RAM headroom per role.
    Returns a dict with ``markdown``.
    """
    where = "pd_capacity_report"
    if not isinstance(summary, Mapping) or not isinstance(summary.get("capacity"), Mapping):
        raise PdError(where, "summary", "has no capacity (the cluster failed validation?)",
                      "pass hostvars['localhost'].pd_plan_fleet.clusters[<cluster>] of a valid plan")
    cluster = _normalized(config, where) if config is not None else None
    if cluster is not None:
        work, family, name = cluster["workload"], cluster["model"]["family"], cluster["name"]
    else:
        base = model.defaults()["cluster"]
        work, family = base["workload"], base["model"]["family"]
        name = (summary.get("proxy") or {}).get("cluster") or "cluster"
    p99_prompt = work["p99_prompt_tokens"]
    p99_total = work["p99_prompt_tokens"] + work["p99_output_tokens"]
    roles, measured_any = {}, False
    for role, cap in summary["capacity"].items():
        marginal, fixed, source, measured = _bytes_model(baseline, role, family)
        measured_any = measured_any or measured
        length = p99_total if role == "decode" else p99_prompt
        footprint = fixed + marginal * length
        per_worker = cap["kv_budget_per_dp_group_bytes"] // cap["tp"]
        fit_requests = int(per_worker // footprint) if footprint else 0
        entry = {
            "instances": cap["instances"], "dp": cap["dp"], "tp": cap["tp"],
            "kv_budget_per_host_bytes": cap["kv_budget_per_host_bytes"],
            "kv_budget_per_dp_group_bytes": cap["kv_budget_per_dp_group_bytes"],
            "kv_budget_per_worker_bytes": per_worker,
            "bytes_model": {"marginal_bytes_per_token": marginal, "fixed_bytes_per_request": fixed,
                            "source": source, "measured": measured},
            "p99_length": length,
            "footprint_at_p99_bytes": int(round(footprint)),
            "tokens_fit_per_dp_group_marginal_only": int(per_worker // marginal) if marginal else None,
            "requests_fit_per_dp_group_at_p99": fit_requests,
            "tokens_fit_per_dp_group_at_p99": fit_requests * length,
            "max_num_seqs_per_dp_group": cap["max_num_seqs_per_dp_group"],
            "max_num_batched_tokens": cap["max_num_batched_tokens"],
            "offload_connector": cap["offload_connector"],
            "offload_host_total_bytes": cap["offload_host_total_bytes"],
            "pinned_per_container_bytes": cap["pinned_per_container_bytes"],
            "shm_per_container_bytes": cap["shm_per_container_bytes"],
            "ram_headroom_bytes": dict(cap["ram_headroom_bytes"]),
            "min_ram_headroom_bytes": min(cap["ram_headroom_bytes"].values()) if cap["ram_headroom_bytes"] else None,
        }
        notes = []
        if role == "prefill":
            avg = work["avg_prompt_tokens"]
            rec = capacity.recommend_batched_tokens(avg, tp=cap["tp"])
            configured = capacity.expected_p_concurrency(cap["max_num_seqs_per_dp_group"], cap["dp"],
                                                         cap["max_num_batched_tokens"], avg)
            recommended = capacity.expected_p_concurrency(cap["max_num_seqs_per_dp_group"], cap["dp"],
                                                          rec["recommended"], avg)
            entry["expected_concurrency"] = {"configured": configured, "recommended": recommended,
                                             "recommended_batched_tokens": rec}
            if configured["level"] != "ok":
                notes.append(f"warning: {configured['message']}")
        else:
            seqs = cap["max_num_seqs_per_dp_group"]
            need_group = seqs * footprint * cap["tp"]
            entry["memory_at_configured_concurrency"] = {
                "per_dp_group_bytes": int(round(need_group)),
                "per_instance_bytes": int(round(need_group * cap["dp"])),
                "budget_per_instance_bytes": cap["kv_budget_per_dp_group_bytes"] * cap["dp"],
                "share_of_budget": need_group / cap["kv_budget_per_dp_group_bytes"],
                "max_num_seqs_that_fit": fit_requests,
            }
            if seqs > fit_requests:
                notes.append(f"warning: max_num_seqs {seqs} per DP group x a P99 request ({length} tokens) needs "
                             f"{_h(need_group)} of {_h(cap['kv_budget_per_dp_group_bytes'])}: expect preemptions at "
                             f"full load; {fit_requests} fit (or add decode offload / lower max_model_len)")
        if not measured:
            notes.append("estimate: the fixed per-request KV cost is unknown until playbooks/baseline.yml measures it")
        entry["notes"] = notes
        roles[role] = entry
    report = {"cluster": name, "source": "measured" if measured_any else "estimate", "workload": dict(work),
              "family": family, "roles": roles}
    report["markdown"] = _capacity_markdown(report)
    return report


def _capacity_markdown(report):
    roles = report["roles"]
    cols = [r for r in model.ROLES if r in roles]
    lines = [f"# Capacity of {report['cluster']} ({report['source']})", ""]
    for role in cols:
        lines.append(f"- {role}: bytes per token from {roles[role]['bytes_model']['source']}")
    lines += ["", "| | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]

    def row(label, fn):
        lines.append(f"| {label} | " + " | ".join(fn(roles[r]) for r in cols) + " |")

    row("instances x DP x TP", lambda e: f"{e['instances']} x {e['dp']} x {e['tp']}")
    row("KV budget per host", lambda e: _h(e["kv_budget_per_host_bytes"]))
    row("KV budget per DP group", lambda e: _h(e["kv_budget_per_dp_group_bytes"]))
    row("KV budget per worker (NPU)", lambda e: _h(e["kv_budget_per_worker_bytes"]))
    row("marginal bytes/token per worker", lambda e: f"{e['bytes_model']['marginal_bytes_per_token']:.0f}")
    row("fixed bytes per request", lambda e: _h(e["bytes_model"]["fixed_bytes_per_request"]))
    row("P99 length (D: prompt+output)", lambda e: str(e["p99_length"]))
    row("footprint of a P99 request per worker", lambda e: _h(e["footprint_at_p99_bytes"]))
    row("tokens per DP group (marginal only)", lambda e: f"{e['tokens_fit_per_dp_group_marginal_only']:,}")
    row("P99 requests that fit a DP group", lambda e: str(e["requests_fit_per_dp_group_at_p99"]))
    row("max-num-seqs per DP group", lambda e: str(e["max_num_seqs_per_dp_group"]))
    row("max-num-batched-tokens", lambda e: str(e["max_num_batched_tokens"]))
    row("P concurrency: configured / recommended batched tokens",
        lambda e: (f"{e['expected_concurrency']['configured']['concurrency']} / "
                   f"{e['expected_concurrency']['recommended']['concurrency']} "
                   f"(at {e['expected_concurrency']['recommended_batched_tokens']['recommended']})")
        if "expected_concurrency" in e else "-")
    row("D memory at configured concurrency (instance)",
        lambda e: (f"{_h(e['memory_at_configured_concurrency']['per_instance_bytes'])} of "
                   f"{_h(e['memory_at_configured_concurrency']['budget_per_instance_bytes'])} "
                   f"({e['memory_at_configured_concurrency']['share_of_budget']:.0%})")
        if "memory_at_configured_concurrency" in e else "-")
    row("offload connector", lambda e: e["offload_connector"])
    row("offload pool per host", lambda e: _h(e["offload_host_total_bytes"]))
    row("pinned / shm per container", lambda e: f"{_h(e['pinned_per_container_bytes'])} / {_h(e['shm_per_container_bytes'])}")
    row("min RAM headroom (RAM - pinned)", lambda e: _h(e["min_ram_headroom_bytes"]))
    notes = [f"- {role}: {n}" for role in cols for n in roles[role]["notes"]]
    if notes:
        lines += ["", "Notes:", ""] + notes
    return "\n".join(lines) + "\n"


def capacity_chart_svg(report):
    """A small self-contained SVG bar chart of a ``capacity_report`` (no external resources).

    Per role, in GiB per DP group: the KV budget, the KV needed at the configured concurrency with P99
    requests (max_num_seqs x footprint x TP), and the pinned offload per container.
    """
    if not isinstance(report, Mapping) or not isinstance(report.get("roles"), Mapping):
        raise PdError("pd_capacity_chart_svg", "report", "is not a capacity report", "pass pd_capacity_report's result")
    bars = []
    for role in [r for r in model.ROLES if r in report["roles"]]:
        e = report["roles"][role]
        need = e["max_num_seqs_per_dp_group"] * e["footprint_at_p99_bytes"] * e["tp"]
        bars += [(f"{role}: KV budget per DP group", e["kv_budget_per_dp_group_bytes"], "#4e79a7"),
                 (f"{role}: KV for max-num-seqs x P99 request", need, "#e15759" if need > e["kv_budget_per_dp_group_bytes"]
                  else "#59a14f"),
                 (f"{role}: pinned CPU offload per container", e["pinned_per_container_bytes"], "#f28e2b")]
    width, left, right, bar_h, gap, top = 760, 300, 110, 22, 10, 44
    height = top + len(bars) * (bar_h + gap) + 20
    scale = max([v for _, v, _ in bars] + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<title>{escape("KV capacity of " + str(report["cluster"]))}</title>',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="10" y="22" font-size="15" font-weight="bold">'
             f'{escape("KV capacity of " + str(report["cluster"]) + " (" + report["source"] + ", GiB)")}</text>']
    for i, (label, value, colour) in enumerate(bars):
        y = top + i * (bar_h + gap)
        length = (width - left - right) * value / scale
        parts.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(label)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar_h}" fill="{colour}"/>')
        parts.append(f'<text x="{left + length + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{value / GIB:.1f}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------
# monitoring

def _addresses(plan):
    """{host: address} from the launch specs (HCCL_IF_IP is the host's address)."""
    out = {}
    for host, entry in plan["hosts"].items():
        for spec in entry.get("specs") or []:
            if spec.get("env", {}).get("HCCL_IF_IP"):
                out.setdefault(host, spec["env"]["HCCL_IF_IP"])
    return out


def _check_plan(plan, where):
    if not isinstance(plan, Mapping) or not isinstance(plan.get("clusters"), Mapping) \
            or not isinstance(plan.get("hosts"), Mapping):
        raise PdError(where, "plan", "is not a fleet plan", "pass hostvars['localhost'].pd_plan_fleet")


def prometheus_scrape_config(plan, blackbox="127.0.0.1:9115", scrape_interval="15s", addresses=None):
    """A Prometheus configuration scraping every engine rank of every cluster of ``plan``.

    One job ``pd-<cluster>`` per cluster: targets ``<host address>:<rank port>`` (path /metrics) with
    labels ``cluster``, ``role``, ``instance`` (the container name), ``pd_instance`` (P/D instance
    index), ``dp_rank`` and ``host``. The proxy serves no /metrics, so it is probed: job
    ``pd-<cluster>-proxy`` through a blackbox exporter at ``blackbox`` (module http_2xx on its
    /healthcheck; ``probe_success`` is "proxy up"). ``addresses`` ({host: address}) overrides the
    addresses taken from the specs.
    """
    where = "pd_prometheus_scrape_config"
    _check_plan(plan, where)
    addr = _addresses(plan)
    addr.update(addresses or {})
    jobs = []
    for name in sorted(plan["clusters"]):
        summary = plan["clusters"][name]
        targets = []
        for host in summary["hosts"]:
            for spec in plan["hosts"][host]["specs"]:
                targets.append({"targets": [f"{addr.get(host, host)}:{spec['ports']['http']}"],
                                "labels": {"cluster": name, "role": spec["role"], "instance": spec["name"],
                                           "pd_instance": str(spec["instance"]), "dp_rank": str(spec["dp_rank"]),
                                           "host": host}})
        jobs.append({"job_name": f"pd-{name}", "metrics_path": "/metrics", "scrape_interval": scrape_interval,
                     "static_configs": targets})
        proxy = summary.get("proxy")
        if proxy:
            url = f"http://{addr.get(proxy['host'], proxy['host'])}:{proxy['ports']['http']}/healthcheck"
            jobs.append({
                "job_name": f"pd-{name}-proxy", "metrics_path": "/probe", "scrape_interval": scrape_interval,
                "params": {"module": ["http_2xx"]},
                "static_configs": [{"targets": [url], "labels": {"cluster": name, "role": "proxy",
                                                                 "instance": proxy["name"], "host": proxy["host"]}}],
                "relabel_configs": [{"source_labels": ["__address__"], "target_label": "__param_target"},
                                    {"target_label": "__address__", "replacement": blackbox}],
            })
    return {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": jobs}


def _panel(pid, title, exprs, grid, description, unit=None, thresholds=None, kind="timeseries", extra=None):
    defaults = {"unit": unit} if unit else {}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]
                                  + [{"color": c, "value": v} for v, c in thresholds]}
        if kind == "timeseries":
            defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    panel = {
        "id": pid, "type": kind, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": dict(zip(("x", "y", "w", "h"), grid)),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(exprs)],
    }
    panel.update(extra or {})
    return panel


def grafana_dashboard(plan, kv_high=KV_HIGH):
    """A Grafana dashboard (JSON model) with one panel per signal of the article's pitfall table.

    Panels: requests running, requests waiting, KV cache usage (threshold line at ``kv_high``),
    preemption rate, TTFT p50 / p95 from the histogram, proxy up (blackbox ``probe_success``).
    Variables: ``datasource`` (Prometheus) and ``cluster`` (the plan's clusters).
    """
    where = "pd_grafana_dashboard"
    _check_plan(plan, where)
    sel = 'cluster=~"$cluster"'
    by = "cluster, role, instance"
    panels = [
        _panel(1, "Requests running", [(f"sum by ({by}) (vllm:num_requests_running{{{sel}}})", "{{instance}}")],
               (0, 0, 12, 8), "Prefill stuck at 1 while requests wait: max-num-batched-tokens < prompt; raise it "
               "to >= 2 x average prompt."),
        _panel(2, "Requests waiting", [(f"sum by ({by}) (vllm:num_requests_waiting{{{sel}}})", "{{instance}}")],
               (12, 0, 12, 8), "Queue per rank; with running stuck at 1 on prefill the token budget is too small."),
        _panel(3, "KV cache usage", [(f"max by ({by}) (vllm:kv_cache_usage_perc{{{sel}}})", "{{instance}}")],
               (0, 8, 12, 8), f"Above {kv_high} sustained: the KV pool is nearly empty; add CPU offload or lower "
               "max-model-len.", unit="percentunit", thresholds=[(kv_high, "red")],
               extra={"options": {"legend": {"displayMode": "list"}}}),
        _panel(4, "Preemptions per second", [(f"sum by ({by}) (rate(vllm:num_preemptions_total{{{sel}}}[5m]))",
                                               "{{instance}}")],
               (12, 8, 12, 8), "Should stay 0. Above 0 the KV is truly short: lower max-num-seqs on D or add "
               "RecomputeCPUOffloadConnector.", unit="ops", thresholds=[(0.0001, "red")]),
        _panel(5, "Time to first token p50 / p95",
               [(f"histogram_quantile(0.5, sum by (le, cluster, role) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[5m])))", "p50 {{cluster}}/{{role}}"),
                (f"histogram_quantile(0.95, sum by (le, cluster, role) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[5m])))", "p95 {{cluster}}/{{role}}")],
               (0, 16, 12, 8), "TTFT growing under steady load: batch too large, requests queue; lower "
               "max-num-batched-tokens.", unit="s"),
        _panel(6, "Proxy up", [(f'max by (cluster) (probe_success{{role="proxy", {sel}}})', "{{cluster}}")],
               (12, 16, 12, 8), "The PD proxy's /healthcheck probed by the blackbox exporter (1 = up).",
               kind="stat", thresholds=[(1, "green")],
               extra={"options": {"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
                      "fieldConfig": {"defaults": {
                          "mappings": [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                                                     "1": {"text": "UP", "color": "green"}}}],
                          "thresholds": {"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                                       {"color": "green", "value": 1}]}},
                          "overrides": []}}),
    ]
    clusters = sorted(plan["clusters"])
    return {
        "uid": "pd-deploy-ops", "title": "pd-deploy: PD clusters (pitfall table signals)",
        "tags": ["pd-deploy", "vllm-ascend"], "timezone": "browser", "schemaVersion": 39, "version": 1,
        "editable": True, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "cluster", "type": "custom", "label": "cluster", "multi": True, "includeAll": True,
             "query": ",".join(clusters),
             "current": {"text": "All", "value": "$__all"},
             "options": [{"text": c, "value": c, "selected": False} for c in clusters]},
        ]},
        "panels": panels,
    }


FILTERS = {
    "pd_parse_metrics": parse_metrics,
    "pd_metrics_window": metrics_window,
    "pd_metrics_summary": metrics_summary,
    "pd_count_recompute": count_recompute,
    "pd_normalized_cluster": normalized_cluster,
    "pd_diagnose": diagnose,
    "pd_verdict": verdict,
    "pd_health_ranks": health_ranks,
    "pd_health_clusters": health_clusters,
    "pd_gate_answers": gate_answers,
    "pd_token_gate": token_gate,
    "pd_gate_message": gate_message,
    "pd_one_change": one_change,
    "pd_diff_paths": diff_paths,
    "pd_tune_check": tune_check,
    "pd_tune_record": tune_record,
    "pd_spec_hashes": spec_hashes,
    "pd_running_drift": running_drift,
    "pd_model_band": model_band,
    "pd_model_estimate": model_estimate,
    "pd_baseline_spec": baseline_spec,
    "pd_baseline_boots": baseline_boots,
    "pd_baseline_failure": baseline_failure,
    "pd_image_identity": image_identity,
    "pd_baseline_report": baseline_report,
    "pd_baseline_markdown": baseline_markdown,
    "pd_capacity_report": capacity_report,
    "pd_capacity_chart_svg": capacity_chart_svg,
    "pd_prometheus_scrape_config": prometheus_scrape_config,
    "pd_grafana_dashboard": grafana_dashboard,
}
