# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 2, diagnosis: the article's pitfall table (DOMAIN.md §6) applied to a rank's scrapes and log.

``diagnose`` judges one rank, ``verdict`` sums findings up; ``health_ranks`` / ``health_clusters``
adapt Ansible loop results, ``metrics_summary`` the figures of a load run.
"""

import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from ..plan import capacity, model
from ..rollout.containers import clean_log
from ..shared import sizes
from ..shared.errors import PdError
from . import common, metrics
from .common import p99_request_len
from .metrics import metrics_window, parse_metrics

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


def _role(role, where):
    if role not in model.ROLES:
        raise PdError(where, "role", f"{role!r} is not a role", f"use one of {', '.join(model.ROLES)}")
    return role


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


def _recompute_pitfall(parsed, cluster, where):
    """D's ``vllm:prompt_tokens_by_source_total{source="local_compute"}`` grew between the first and
    the last scrape while the cluster has a prefill role: D prefilled prompts itself, the work P exists
    for (vLLM v0.27.1 vllm/v1/metrics/stats.py: D's prompt tokens whose KV came from P count as
    external_kv_transfer). None without the counter in both scrapes, on a reset, or with no growth."""
    first, last = parsed[0].get("prompt_tokens_by_source"), parsed[-1].get("prompt_tokens_by_source")
    if first is None or last is None or cluster["roles"]["prefill"].get("instances", 0) < 1:
        return None
    grew = {k: v - first.get(k, 0.0) for k, v in last.items()}
    if any(v < 0 for v in grew.values()) or grew.get("local_compute", 0.0) <= 0:
        return None
    local, external = grew.get("local_compute", 0.0), grew.get("external_kv_transfer", 0.0)
    share = local / (local + external)
    checks = ("prefill.mooncake and decode.mooncake are true (both render the Mooncake child of "
              "--kv-transfer-config); the proxy/router passes P's kv_transfer_params to D; D reaches P's "
              "KV port and Mooncake bootstrap; P's and D's logs for transfer errors or timeouts")
    return _finding(
        "critical" if external == 0 else "warning",
        'vllm:prompt_tokens_by_source_total{source="local_compute"}',
        f"+{_fmt(local)} local_compute, +{_fmt(external)} external_kv_transfer between the first and last scrape "
        f"({share:.0%} of D's new prompt tokens computed on D)",
        "recompute pitfall: D prefilled prompts itself instead of receiving P's KV (P's work is repeated, "
        "TTFT and D's batch pay for it)", f"check that {checks}", where)


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
    parsed = [metrics.sample(item, fn, i) for i, item in enumerate(samples)]
    cluster = common.normalized(config, fn)
    rcfg = cluster["roles"][role]
    rank = _Rank(role, cluster, rcfg, rcfg["engine"], where or f"{cluster['name']}/{role}", parsed,
                 p99_request_len(cluster), cluster["workload"]["avg_prompt_tokens"])
    findings = _preemptions(rank) + _kv_usage(rank, kv_high, sustain)
    if role == "prefill":
        findings += _running_stuck(rank)
        if len(parsed) >= 2:
            findings += _ttft_growth(rank, findings, ttft_growth)
    # D computes prompt tokens itself although a P exists: the recompute pitfall (P's KV never arrived)
    if role == "decode" and len(parsed) >= 2:
        finding = _recompute_pitfall(parsed, cluster, rank.where)
        if finding:
            findings.append(finding)
    if log_text is not None:
        findings += _log_recompute(rank, log_text) + _log_oom(rank, log_text)
    return findings


class _Rank(NamedTuple):
    """What every step of ``diagnose`` reads about the rank it judges."""

    role: str
    cluster: dict
    rcfg: dict  # the role's normalized config
    eng: dict  # its engine settings
    where: str
    parsed: list  # parse_metrics results, oldest first
    p99: int  # P99 prompt + output tokens
    avg: int  # the workload's average prompt tokens


def _fewer_seqs(seqs):
    """The next max_num_seqs down the step (SEQS_STEP), at least 1."""
    return max(1, seqs * SEQS_STEP[0] // SEQS_STEP[1])


def _preemptions(rank):
    """num_preemptions > 0: KV truly short."""
    role, rcfg, eng, where = rank.role, rank.rcfg, rank.eng, rank.where
    preempt = [s["num_preemptions"] for s in rank.parsed if s["num_preemptions"] is not None]
    if not preempt:
        return []
    seqs = eng["max_num_seqs"]
    fewer = _fewer_seqs(seqs)
    grew = None
    if len(preempt) >= 2:
        grew = preempt[-1] - preempt[0] if preempt[-1] >= preempt[0] else preempt[-1]
    total = preempt[-1]
    if (grew is not None and grew > 0) or (grew is None and total > 0):
        parts = [f"lower {role}.engine.max_num_seqs from {seqs} to {fewer}"]
        if role == "decode" and rcfg["offload_connector"] != "RecomputeCPUOffloadConnector":
            parts.append(_offload_hint(rcfg, role))
        if eng["max_model_len"] > rank.p99:
            parts.append(f"lower {role}.engine.max_model_len from {eng['max_model_len']} to {rank.p99} "
                         f"(P99 prompt + output)")
        value = (f"+{_fmt(grew)} between the first and last scrape (total {_fmt(total)})"
                 if grew is not None else f"{_fmt(total)} since the engine started")
        return [_finding(
            "critical", "vllm:num_preemptions", value,
            "KV truly short: running requests were evicted to make room (should stay 0)",
            " or ".join(parts), where, {"param": f"{role}.engine.max_num_seqs", "value": fewer})]
    if total > 0:
        return [_finding(
            "warning", "vllm:num_preemptions", f"{_fmt(total)} since the engine started, none between scrapes",
            "KV ran short earlier (e.g. a burst); not during this check",
            f"watch it; if it grows, lower {role}.engine.max_num_seqs from {eng['max_num_seqs']} to "
            f"{_fewer_seqs(eng['max_num_seqs'])}", where)]
    return []


def _kv_usage(rank, kv_high, sustain):
    """kv_cache_usage_perc > 0.9 sustained: KV pool nearly empty."""
    role, eng, where = rank.role, rank.eng, rank.where
    usage = [s["kv_cache_usage_perc"] for s in rank.parsed if s["kv_cache_usage_perc"] is not None]
    if not (usage and usage[-1] > kv_high):
        return []
    sustained = len(usage) >= sustain and all(u > kv_high for u in usage[-sustain:])
    parts = [_offload_hint(rank.rcfg, role)]
    change = None
    if eng["max_model_len"] > rank.p99:
        parts.append(f"lower {role}.engine.max_model_len from {eng['max_model_len']} to {rank.p99} (P99 prompt + output)")
        change = {"param": f"{role}.engine.max_model_len", "value": rank.p99}
    shown = ", ".join(f"{u:.2f}" for u in usage[-max(sustain, 1):])
    if sustained:
        return [_finding(
            "warning", "vllm:kv_cache_usage_perc", f"{shown} (> {kv_high} in the last {sustain} scrapes)",
            "KV pool nearly empty: the next long request will preempt or wait", " or ".join(parts), where, change)]
    return [_finding(
        "info", "vllm:kv_cache_usage_perc", f"{usage[-1]:.2f} at the last scrape",
        f"above {kv_high} once; not sustained over {sustain} scrapes",
        "re-run the health check under load; if it stays above, " + " or ".join(parts), where)]


def _running_stuck(rank):
    """Running stuck at 1 with a queue on prefill: token budget < prompt."""
    parsed, avg = rank.parsed, rank.avg
    pairs = [(s["num_requests_running"], s["num_requests_waiting"]) for s in parsed]
    stuck = [p for p in pairs if p[0] is not None and p[1] is not None]
    if not (stuck and len(stuck) == len(pairs) and all(r == 1 and w > 0 for r, w in stuck)):
        return []
    measured = None
    if len(parsed) >= 2:
        measured = metrics_window(parsed[0], parsed[-1])["avg_prompt_tokens"]
    basis = max(avg, int(math.ceil(measured))) if measured else avg
    rec = capacity.recommend_batched_tokens(basis, tp=rank.rcfg["tp"])
    configured = rank.eng["max_num_batched_tokens"]
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
    waiting = ", ".join(_fmt(w) for _running, w in stuck)
    return [_finding(
        "critical" if len(stuck) >= 2 else "warning", "vllm:num_requests_running",
        f"running 1 with waiting {waiting} in every scrape ({note}configured average {avg})",
        "token budget < prompt: one prompt fills max-num-batched-tokens, the rest queue "
        "(max-num-seqs is not the limit)", action, rank.where, change)]


def _ttft_growth(rank, findings, ttft_growth):
    """TTFT grows between scrapes (prefill): batch too large, queueing; ``findings`` so far tell
    whether the running-stuck-at-1 finding explains it."""
    rcfg, where = rank.rcfg, rank.where
    before, windows = _ttft_windows(rank.parsed)
    reference = before if before else (windows[0] if len(windows) >= 2 else None)
    if not (windows and reference and windows[-1] >= ttft_growth * reference):
        return []
    if any(f["signal"] == "vllm:num_requests_running" for f in findings):
        return [_finding(
            "info", "vllm:time_to_first_token_seconds",
            f"mean {windows[-1]:.3f} s in the last window vs {reference:.3f} s before",
            "TTFT grows because prompts queue behind the one running prefill",
            "fix the running-stuck-at-1 finding first; do not lower max-num-batched-tokens now", where)]
    configured = rank.eng["max_num_batched_tokens"]
    lower = next((level for level in BATCH_LEVELS if level < configured), None)
    if lower is None:
        action = (f"prefill.engine.max_num_batched_tokens {configured} is at the table's floor: "
                  f"add a prefill instance (prefill.instances: {rcfg['instances'] + 1})")
        change = {"param": "prefill.instances", "value": rcfg["instances"] + 1}
    else:
        action = f"lower prefill.engine.max_num_batched_tokens from {configured} to {lower}"
        if lower < 2 * rank.avg:
            action += (f" (below 2 x average prompt {2 * rank.avg}: fewer prompts per step) or add a prefill "
                       f"instance (prefill.instances: {rcfg['instances'] + 1})")
        change = {"param": "prefill.engine.max_num_batched_tokens", "value": lower}
    return [_finding(
        "warning", "vllm:time_to_first_token_seconds",
        f"mean {windows[-1]:.3f} s in the last window vs {reference:.3f} s before",
        "TTFT grows: the batch is too large and requests queue behind it (or the load grew)",
        action, where, change)]


def _log_recompute(rank, log_text):
    """Recompute lines in a decode rank's log: preempted requests, parked in CPU or re-prefilled."""
    lines = count_recompute(log_text)
    if not lines or rank.role != "decode":
        return []
    seqs = rank.eng["max_num_seqs"]
    fewer = _fewer_seqs(seqs)
    if rank.rcfg["offload_connector"] == "RecomputeCPUOffloadConnector":
        return [_finding(
            "info", "log: [RecomputeScheduler] Recompute triggered", lines,
            "D ran out of KV and preempted requests; their KV was parked in CPU and restored",
            f"none while rare; if frequent, lower decode.engine.max_num_seqs from {seqs} to {fewer}",
            rank.where)]
    return [_finding(
        "warning", "log: [RecomputeScheduler] Recompute triggered", lines,
        "D ran out of KV and preempted requests; without a CPU pool they are re-prefilled",
        f"{_offload_hint(rank.rcfg, rank.role)}, or lower decode.engine.max_num_seqs from {seqs} to {fewer}",
        rank.where, {"param": "decode.engine.max_num_seqs", "value": fewer})]


def _log_oom(rank, log_text):
    """An out-of-memory error in the log: P's batch (activations) or D's KV and activations."""
    if not _OOM_RE.search(clean_log(log_text if isinstance(log_text, str) else "\n".join(log_text))):
        return []
    eng = rank.eng
    if rank.role == "prefill":
        configured = eng["max_num_batched_tokens"]
        lower = next((level for level in BATCH_LEVELS[1:] if level < configured), BATCH_LEVELS[-1])
        return [_finding(
            "critical", "log: out of memory", "an out-of-memory error in the log",
            "P OOM: max-num-batched-tokens too large (activation memory)",
            f"lower prefill.engine.max_num_batched_tokens from {configured} to {lower} (back to 24576 / 16384)",
            rank.where, {"param": "prefill.engine.max_num_batched_tokens", "value": lower})]
    return [_finding(
        "critical", "log: out of memory", "an out-of-memory error in the log",
        "D OOM: KV and activations exceed HBM",
        f"lower decode.engine.max_num_seqs from {eng['max_num_seqs']} to "
        f"{_fewer_seqs(eng['max_num_seqs'])}, or keep "
        f"decode.engine.gpu_memory_utilization at 0.85 (now {eng['gpu_memory_utilization']})", rank.where)]


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
    the cluster's ``pd_cluster``, raw or normalized (pd_ops passes the plan's ``clusters[c].config``); ``proxy`` / ``proxy_result``:
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
                "the rank is down or not serving", f"read its log (playbooks/collect_logs.yml), then "
                f"playbooks/deploy_pd.yml --limit {spec['cluster']}", rank_where))
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
                f"playbooks/deploy_pd.yml --limit {proxy['cluster']} re-creates it; its log: playbooks/collect_logs.yml",
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
        pairs = sorted(((metrics.le_value(le), c) for le, c in role.pop("_buckets").items()), key=lambda p: p[0])
        ttft_sum = role.pop("_ttft_sum")
        role["ttft_mean"] = ttft_sum / role["requests"] if role["requests"] else None
        role["ttft_p50"], role["ttft_p95"] = metrics.quantile(pairs, 0.5), metrics.quantile(pairs, 0.95)
    if load is not None:
        out["load"] = load
    return out
