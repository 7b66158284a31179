"""pd_deploy.ops: metrics, the pitfall-table diagnosis, token gate, one-change rule, KV baseline,
capacity report, monitoring config; plus the operations playbooks run against stand-in HTTP servers on
127.0.0.1 (no Docker, no other network).

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

from pd_deploy import capacity, fleet, logparse, model, ops
from pd_deploy.errors import PdError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1024 ** 3
MIB = 1024 ** 2
# vLLM's TTFT histogram buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

# A cluster as an operator writes it in group_vars: the article's "16K prompts with 8192 batched tokens".
CLUSTER = {
    "name": "c1", "vllm_ascend_version": "0.25.1", "image": "quay.io/ascend/vllm-ascend:v0.25.1",
    "model": {"path": "/data/models/DeepSeek-V4-Flash"},
    "workload": {"avg_prompt_tokens": 16384, "p99_prompt_tokens": 28672, "p99_output_tokens": 4096},
    "prefill": {"engine": {"max_num_batched_tokens": 8192}},
    "decode": {"engine": {"max_model_len": 65536}},
}
NORM = model.normalize("c1", copy.deepcopy(CLUSTER))
D_SEQS = NORM["roles"]["decode"]["engine"]["max_num_seqs"]
P99 = CLUSTER["workload"]["p99_prompt_tokens"] + CLUSTER["workload"]["p99_output_tokens"]


# ---- generators ---------------------------------------------------------------------------------

def page(*engines, kv_name="vllm:kv_cache_usage_perc"):
    """A vLLM /metrics page, one label set per engine dict (running, waiting, kv, preemptions, ttft
    observations in seconds, prompt_tokens)."""
    engines = engines or ({},)
    lines = []

    def family(name, kind, samples):
        lines.append(f"# HELP {name} test")
        lines.append(f"# TYPE {name} {kind}")
        for index, (suffix, extra, value) in samples:
            labels = f'engine="{index}",model_name="deepseek-v4-flash"' + (f",{extra}" if extra else "")
            lines.append(f"{name}{suffix}{{{labels}}} {float(value)!r}")

    family("vllm:num_requests_running", "gauge", [(i, ("", "", e.get("running", 0))) for i, e in enumerate(engines)])
    family("vllm:num_requests_waiting", "gauge", [(i, ("", "", e.get("waiting", 0))) for i, e in enumerate(engines)])
    family(kv_name, "gauge", [(i, ("", "", e.get("kv", 0.0))) for i, e in enumerate(engines)])
    family("vllm:num_preemptions", "counter", [(i, ("_total", "", e.get("preemptions", 0))) for i, e in enumerate(engines)])
    family("vllm:prompt_tokens", "counter", [(i, ("_total", "", e.get("prompt_tokens", 0))) for i, e in enumerate(engines)])
    hist = []
    for i, e in enumerate(engines):
        obs = e.get("ttft", ())
        for le in TTFT_BUCKETS:
            hist.append((i, ("_bucket", f'le="{le}"', sum(1 for t in obs if t <= le))))
        hist.append((i, ("_bucket", 'le="+Inf"', len(obs))))
        hist.append((i, ("_sum", "", sum(obs))))
        hist.append((i, ("_count", "", len(obs))))
    family("vllm:time_to_first_token_seconds", "histogram", hist)
    return "\n".join(lines) + "\n"


def vllm_log(max_model_len, fixed, marginal, available_gib=30.0, workers=4):
    """Start-up lines as vLLM prints them for a footprint of fixed + marginal x length per request."""
    available = available_gib * GIB
    concurrency = available / (fixed + marginal * max_model_len)
    tokens = int(concurrency * max_model_len)
    lines = ["INFO 05-14 09:12:01 [__init__.py:216] Automatically detected platform npu."]
    for tp in range(workers):
        lines.append(f"(EngineCore_DP0 pid=11) (Worker_TP{tp} pid={20 + tp}) INFO 05-14 09:14:33 [worker.py:260] "
                     f"Available KV cache memory: {available_gib:.2f} GiB")
    lines.append(f"(EngineCore_DP0 pid=11) INFO 05-14 09:14:34 [kv_cache_utils.py:1087] GPU KV cache size: {tokens:,} tokens")
    lines.append(f"(EngineCore_DP0 pid=11) INFO 05-14 09:14:34 [kv_cache_utils.py:1091] Maximum concurrency for "
                 f"{max_model_len:,} tokens per request: {concurrency:.2f}x")
    return "\n".join(lines) + "\n"


def plan_of(raw_cluster, p_hosts=("c1-p0",), d_hosts=("c1-d0",)):
    hv = {"pd_cluster": raw_cluster, "pd_host_address": "10.1.0.{n}", "pd_npus": 8, "pd_host_ram": "1TiB",
          "pd_hccl_if": "eth0"}
    hosts = []
    for n, (name, role) in enumerate([(h, "prefill") for h in p_hosts] + [(h, "decode") for h in d_hosts]):
        vars_ = dict(hv, pd_host_address=f"10.1.0.{n + 1}")
        hosts.append({"name": name, "groups": ["pd_clusters", raw_cluster["name"], role], "vars": vars_})
    plan = fleet.plan_fleet({"hosts": hosts, "limit": None})
    assert plan["ok"], plan["messages"]
    return plan


PLAN = plan_of(CLUSTER)


# ---- metrics ------------------------------------------------------------------------------------

def test_parse_metrics_sums_request_gauges_and_counters_and_takes_the_fullest_engine():
    a = {"running": 3, "waiting": 1, "kv": 0.42, "preemptions": 2, "ttft": [0.05, 0.3], "prompt_tokens": 1000}
    b = {"running": 2, "waiting": 4, "kv": 0.91, "preemptions": 5, "ttft": [0.07], "prompt_tokens": 500}
    got = ops.parse_metrics(page(a, b))
    assert got["num_requests_running"] == a["running"] + b["running"]
    assert got["num_requests_waiting"] == a["waiting"] + b["waiting"]
    assert got["kv_cache_usage_perc"] == max(a["kv"], b["kv"])
    assert got["num_preemptions"] == a["preemptions"] + b["preemptions"]
    assert got["prompt_tokens"] == a["prompt_tokens"] + b["prompt_tokens"]
    hist = got["time_to_first_token_seconds"]
    observations = a["ttft"] + b["ttft"]
    assert hist["count"] == len(observations)
    assert hist["sum"] == pytest.approx(sum(observations))
    assert hist["mean"] == pytest.approx(sum(observations) / len(observations))
    buckets = {b_["le"]: b_["count"] for b_ in hist["buckets"]}
    assert buckets["0.1"] == sum(1 for t in observations if t <= 0.1)
    assert buckets["+Inf"] == len(observations)
    # the median (2nd of 3) lies in the (0.06, 0.08] bucket: linear interpolation like histogram_quantile
    assert 0.06 < hist["p50"] <= 0.08
    assert got["missing"] == []
    assert got["engines"] == ["0", "1"]


def test_parse_metrics_reads_the_v0_kv_gauge_and_lists_missing_signals():
    text = "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\nvllm:num_requests_running 2\n"
    got = ops.parse_metrics(text)
    assert got["kv_cache_usage_perc"] == 0.5
    assert got["num_requests_running"] == 2
    assert got["num_preemptions"] is None and got["time_to_first_token_seconds"] is None
    assert got["missing"] == ["vllm:num_requests_waiting", "vllm:num_preemptions", "vllm:time_to_first_token_seconds"]


@pytest.mark.parametrize("bad", ["this is { not metrics", 42, None])
def test_parse_metrics_refuses_what_is_not_a_metrics_page(bad):
    with pytest.raises(PdError) as info:
        ops.parse_metrics(bad)
    assert str(info.value).startswith("pd_parse_metrics: text:")


def test_metrics_window_counts_what_happened_between_scrapes():
    first = page({"preemptions": 1, "ttft": [0.1] * 4, "prompt_tokens": 4 * 1000})
    second = page({"preemptions": 4, "ttft": [0.1] * 4 + [0.7] * 2, "prompt_tokens": 4 * 1000 + 2 * 3000,
                   "running": 2})
    got = ops.metrics_window(first, second, seconds=10)
    assert got["preemptions"] == 4 - 1
    assert got["requests"] == 2
    assert got["avg_prompt_tokens"] == 3000
    assert got["ttft_mean"] == pytest.approx(0.7)
    assert 0.5 < got["ttft_p50"] <= 0.75
    assert got["num_requests_running"] == 2
    assert got["reset"] is False


def test_metrics_window_treats_a_counter_going_down_as_a_restart():
    got = ops.metrics_window(page({"preemptions": 9, "ttft": [0.1] * 5}), page({"preemptions": 2, "ttft": [0.2]}))
    assert got["reset"] is True
    assert got["preemptions"] == 2
    assert got["requests"] == 1


# ---- diagnosis ----------------------------------------------------------------------------------

def _one(findings, signal):
    hits = [f for f in findings if f["signal"] == signal]
    assert len(hits) == 1, findings
    return hits[0]


def test_preemptions_growing_on_decode_ask_for_fewer_seqs_or_recompute_offload():
    findings = ops.diagnose([page({"preemptions": 0}), page({"preemptions": 3})], "decode", CLUSTER)
    f = _one(findings, "vllm:num_preemptions")
    fewer = D_SEQS * 3 // 4
    assert f["severity"] == "critical"
    assert "+3" in f["value"]
    assert f"lower decode.engine.max_num_seqs from {D_SEQS} to {fewer}" in f["action"]
    # the cluster has no CPU offload on D: the article's fix is offered too, and max_model_len > P99
    assert "RecomputeCPUOffloadConnector" in f["action"]
    assert f"from {CLUSTER['decode']['engine']['max_model_len']} to {P99}" in f["action"]
    assert f["change"] == {"param": "decode.engine.max_num_seqs", "value": fewer}
    assert f["where"] == "c1/decode"
    assert set(f) == {"severity", "signal", "value", "meaning", "action", "where", "change"}


def test_preemptions_with_recompute_offload_already_there_do_not_suggest_adding_it():
    raw = copy.deepcopy(CLUSTER)
    raw["decode"].update({"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                          "recompute_scheduler": True})
    f = _one(ops.diagnose([page({"preemptions": 0}), page({"preemptions": 1})], "decode", raw),
             "vllm:num_preemptions")
    assert "add decode.offload_connector" not in f["action"]


def test_old_preemptions_only_warn_and_a_single_scrape_above_zero_is_critical():
    steady = ops.diagnose([page({"preemptions": 5}), page({"preemptions": 5})], "decode", CLUSTER)
    assert _one(steady, "vllm:num_preemptions")["severity"] == "warning"
    single = ops.diagnose([page({"preemptions": 1})], "decode", CLUSTER)
    assert _one(single, "vllm:num_preemptions")["severity"] == "critical"
    assert ops.diagnose([page(), page()], "decode", CLUSTER) == []


def test_kv_usage_095_sustained_asks_for_offload_or_a_p99_max_model_len():
    findings = ops.diagnose([page({"kv": 0.95}), page({"kv": 0.95})], "decode", CLUSTER)
    f = _one(findings, "vllm:kv_cache_usage_perc")
    assert f["severity"] == "warning"
    assert "0.95" in f["value"]
    assert "RecomputeCPUOffloadConnector" in f["action"]
    assert f["change"] == {"param": "decode.engine.max_model_len", "value": P99}


def test_kv_usage_high_once_is_only_a_note_and_below_the_line_is_nothing():
    once = ops.diagnose([page({"kv": 0.5}), page({"kv": 0.95})], "decode", CLUSTER)
    assert _one(once, "vllm:kv_cache_usage_perc")["severity"] == "info"
    assert ops.diagnose([page({"kv": 0.95}), page({"kv": 0.5})], "decode", CLUSTER) == []
    three = ops.diagnose([page({"kv": 0.95})] * 3, "decode", CLUSTER, sustain=3)
    assert _one(three, "vllm:kv_cache_usage_perc")["severity"] == "warning"


def test_prefill_running_1_with_5_waiting_raises_batched_tokens_to_the_table_value():
    findings = ops.diagnose([page({"running": 1, "waiting": 5}), page({"running": 1, "waiting": 5})],
                            "prefill", CLUSTER)
    f = _one(findings, "vllm:num_requests_running")
    avg = CLUSTER["workload"]["avg_prompt_tokens"]
    want = capacity.recommend_batched_tokens(avg, tp=NORM["roles"]["prefill"]["tp"])["recommended"]
    assert want >= 2 * avg
    assert f["severity"] == "critical"
    assert f"raise prefill.engine.max_num_batched_tokens from 8192 to {want}" in f["action"]
    assert f["change"] == {"param": "prefill.engine.max_num_batched_tokens", "value": want}


def test_the_measured_average_prompt_drives_the_recommendation_when_it_is_longer():
    avg_measured = 30000  # two requests of 30000 prompt tokens finished between the scrapes
    first = page({"running": 1, "waiting": 5, "ttft": [1.0], "prompt_tokens": 16384})
    second = page({"running": 1, "waiting": 5, "ttft": [1.0] * 3, "prompt_tokens": 16384 + 2 * avg_measured})
    f = _one(ops.diagnose([first, second], "prefill", CLUSTER), "vllm:num_requests_running")
    want = capacity.recommend_batched_tokens(avg_measured, tp=4)["recommended"]
    assert f"to {want}" in f["action"]
    assert f"measured average prompt {avg_measured}" in f["value"]


def test_running_1_with_a_queue_is_not_a_decode_signal_and_needs_the_queue():
    assert ops.diagnose([page({"running": 1, "waiting": 5})] * 2, "decode", CLUSTER) == []
    assert ops.diagnose([page({"running": 1, "waiting": 0})] * 2, "prefill", CLUSTER) == []
    assert ops.diagnose([page({"running": 1, "waiting": 5}), page({"running": 3, "waiting": 5})],
                        "prefill", CLUSTER) == []


def test_ttft_growing_on_prefill_lowers_batched_tokens_one_step():
    raw = copy.deepcopy(CLUSTER)
    raw["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    before = [0.2] * 10                     # mean 0.2 s
    window = [0.9] * 10                     # mean 0.9 s > 1.5 x 0.2
    findings = ops.diagnose([page({"ttft": before}), page({"ttft": before + window})], "prefill", raw)
    f = _one(findings, "vllm:time_to_first_token_seconds")
    assert f["severity"] == "warning"
    assert "lower prefill.engine.max_num_batched_tokens from 32768 to 24576" in f["action"]
    assert f["change"] == {"param": "prefill.engine.max_num_batched_tokens", "value": 24576}
    steady = ops.diagnose([page({"ttft": before}), page({"ttft": before + [0.21] * 10})], "prefill", raw)
    assert [x for x in steady if x["signal"] == "vllm:time_to_first_token_seconds"] == []


def test_ttft_growing_behind_a_stuck_prefill_does_not_ask_to_lower_the_batch():
    before, window = [0.2] * 10, [0.9] * 10
    stuck = [page({"running": 1, "waiting": 5, "ttft": before}), page({"running": 1, "waiting": 7, "ttft": before + window})]
    findings = ops.diagnose(stuck, "prefill", CLUSTER)
    assert _one(findings, "vllm:num_requests_running")["severity"] == "critical"
    ttft = _one(findings, "vllm:time_to_first_token_seconds")
    assert ttft["severity"] == "info" and ttft["change"] is None
    assert "lower prefill.engine.max_num_batched_tokens from" not in ttft["action"]


def test_recompute_lines_in_the_decode_log_are_counted():
    line = "(EngineCore_DP0 pid=7) INFO [recompute_scheduler.py:301] [RecomputeScheduler] Recompute triggered for request cmpl-{}"
    log = "\n".join([line.format(i) for i in range(3)] + ["INFO other line"])
    assert ops.count_recompute(log) == 3
    assert ops.count_recompute(log.splitlines()) == 3
    no_pool = _one(ops.diagnose([page()], "decode", CLUSTER, log_text=log), "log: [RecomputeScheduler] Recompute triggered")
    assert no_pool["severity"] == "warning" and no_pool["value"] == 3
    raw = copy.deepcopy(CLUSTER)
    raw["decode"].update({"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                          "recompute_scheduler": True})
    pooled = _one(ops.diagnose([page()], "decode", raw, log_text=log), "log: [RecomputeScheduler] Recompute triggered")
    assert pooled["severity"] == "info"


def test_an_oom_in_the_prefill_log_goes_back_to_a_smaller_batch():
    raw = copy.deepcopy(CLUSTER)
    raw["prefill"]["engine"]["max_num_batched_tokens"] = 49152
    f = _one(ops.diagnose([page()], "prefill", raw, log_text="RuntimeError: NPU out of memory. Tried to allocate"),
             "log: out of memory")
    assert f["severity"] == "critical"
    assert f["change"] == {"param": "prefill.engine.max_num_batched_tokens", "value": 32768}


@pytest.mark.parametrize("args, field", [
    (([], "decode", CLUSTER), "samples"),
    (([page()], "proxy", CLUSTER), "role"),
    (([page()], "decode", "cluster"), "config"),
    (([42], "decode", CLUSTER), "samples[0]"),
])
def test_diagnose_refuses_bad_input(args, field):
    with pytest.raises(PdError) as info:
        ops.diagnose(*args)
    assert info.value.field == field


def test_verdict_is_the_worst_severity_with_each_action_once():
    crit = ops.diagnose([page({"preemptions": 0}), page({"preemptions": 3})], "decode", CLUSTER)
    note = ops.diagnose([page({"kv": 0.5}), page({"kv": 0.95})], "decode", CLUSTER)
    v = ops.verdict(note + crit + crit)
    assert v["status"] == "critical"
    assert (v["critical"], v["warning"], v["info"]) == (2, 0, 1)
    assert v["actions"][0] == crit[0]["action"] and len(v["actions"]) == 2
    assert v["changes"] == [crit[0]["change"]]
    assert ops.verdict([])["status"] == "ok"
    with pytest.raises(PdError):
        ops.verdict([{"severity": "fatal"}])


def _uri(spec, content, status=200):
    return {"item": spec, "status": status, "content": content}


def test_health_ranks_and_clusters_from_ansible_loop_results():
    specs = PLAN["hosts"]["c1-d0"]["specs"]
    first = [_uri(s, page({"preemptions": 0})) for s in specs]
    second = [_uri(specs[0], page({"preemptions": 3})),
              {"item": specs[1], "status": -1, "msg": "Status code was -1 and not [200]: Request failed: "
                                                     "<urlopen error [Errno 111] Connection refused>"}]
    logs = {s["name"]: "plain line\n" for s in specs}
    ranks = ops.health_ranks(specs, first, second, logs, CLUSTER)
    assert [r["name"] for r in ranks] == [s["name"] for s in specs]
    assert ranks[0]["reachable"] and ranks[0]["verdict"]["status"] == "critical"
    assert ranks[0]["window"]["preemptions"] == 3 and ranks[0]["recompute_lines"] == 0
    assert not ranks[1]["reachable"]
    down_rank = _one(ranks[1]["findings"], "GET /metrics")
    assert down_rank["severity"] == "critical" and down_rank["value"] == "no answer (Connection refused)"
    assert len(ranks[1]["findings"]) == 1, "a half window is not diagnosed"
    proxy = PLAN["clusters"]["c1"]["proxy"]
    down = ops.health_ranks([], [], [], None, CLUSTER, proxy, {"status": -1})
    assert down[0]["role"] == "proxy" and down[0]["verdict"]["status"] == "critical"
    loaded = ops.health_ranks(specs[:1], first[:1], second[:1], {}, CLUSTER,
                              mid_results=[_uri(specs[0], page({"running": 7, "waiting": 2, "preemptions": 1}))])
    assert len(loaded[0]["samples"]) == 3
    assert loaded[0]["peak"] == {"num_requests_running": 7, "num_requests_waiting": 2, "kv_cache_usage_perc": 0.0}
    summary = ops.metrics_summary(loaded + down, load={"throughput_tokens_per_s": 10.0})
    assert summary["decode"]["running"] == 7 and summary["decode"]["preemptions"] == 3
    assert summary["load"] == {"throughput_tokens_per_s": 10.0} and "proxy" not in summary
    clusters = ops.health_clusters(ranks + down)
    assert list(clusters) == ["c1"]
    c1 = clusters["c1"]
    assert c1["verdict"]["critical"] == 3
    assert any(f"lower decode.engine.max_num_seqs from {D_SEQS} to {D_SEQS * 3 // 4}" in line for line in c1["lines"])
    assert c1["lines"][0].startswith("c1: CRITICAL")


# ---- a stand-in engine on 127.0.0.1 -------------------------------------------------------------

class _Pages(BaseHTTPRequestHandler):
    """Serves the next page of ``server.pages`` on each GET /metrics (the last one repeats)."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        if self.path == "/metrics":
            with server.lock:
                body = server.pages[min(server.hits, len(server.pages) - 1)]
                server.hits += 1
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
        elif self.path in ("/healthcheck", "/health"):
            data = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        else:
            data = b"{}"
            self.send_response(404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        words = answer_words(body.get("prompt", ""), body.get("max_tokens", 8), self.server.shift_for(body))
        data = json.dumps({"object": "text_completion", "choices": [
            {"index": 0, "text": "".join(w + " " for w in words), "finish_reason": "length"}],
            "usage": {"completion_tokens": len(words)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def answer_words(prompt, n, shift_at=None):
    """Deterministic 'greedy' words for a prompt; the word at position ``shift_at`` is changed."""
    out = []
    for i in range(n):
        h = int(hashlib.sha256(f"{prompt}|{i}".encode()).hexdigest()[:8], 16)
        out.append(("w%d" % (h % 997)) + ("x" if i == shift_at else ""))
    return out


class StandIn:
    """A ThreadingHTTPServer on 127.0.0.1 (ephemeral port) serving /metrics pages and completions."""

    def __init__(self, pages=("",), shift=None):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
        self.httpd.pages = list(pages)
        self.httpd.hits = 0
        self.httpd.lock = threading.Lock()
        shift = shift or {}
        self.httpd.shift_for = lambda body: shift.get(body.get("prompt"))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reset(self, pages=None):
        with self.httpd.lock:
            self.httpd.hits = 0
            if pages is not None:
                self.httpd.pages = list(pages)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_scrape_of_a_stand_in_engine_over_loopback_is_diagnosed():
    import urllib.request

    engine = StandIn([page({"kv": 0.95, "preemptions": 0}), page({"kv": 0.96, "preemptions": 2})])
    try:
        url = f"http://127.0.0.1:{engine.port}/metrics"
        samples = [urllib.request.urlopen(url, timeout=5).read().decode() for _ in range(2)]
    finally:
        engine.close()
    findings = ops.diagnose(samples, "decode", CLUSTER)
    assert {f["signal"] for f in findings} == {"vllm:num_preemptions", "vllm:kv_cache_usage_perc"}
    assert ops.verdict(findings)["status"] == "critical"


# ---- token gate ---------------------------------------------------------------------------------

def test_token_gate_with_one_changed_token_fails_at_its_position():
    a = [[11, 12, 13, 14], [21, 22, 23, 24, 25], [31, 32]]
    b = copy.deepcopy(a)
    b[1][3] = 99
    got = ops.token_gate(a, b)
    assert got["passed"] is False and got["prompts"] == 3
    assert got["mismatches"] == [{
        "prompt_index": 1, "first_diverging_position": 3, "unit": "token", "a_token": a[1][3], "b_token": 99,
        "a_excerpt": a[1][0:8], "b_excerpt": b[1][0:8]}]
    assert ops.token_gate(a, copy.deepcopy(a)) == {"passed": True, "prompts": 3, "compared_by": ["token_ids"] * 3,
                                                    "mismatches": []}


def test_token_gate_on_texts_reports_the_character_and_a_shorter_answer():
    text = "the quick brown fox"
    pos = text.index("brown")
    got = ops.token_gate([text, "abc"], [text[:pos] + "green fox", "ab"])
    first, second = got["mismatches"]
    assert (first["prompt_index"], first["first_diverging_position"], first["unit"]) == (0, pos, "character")
    assert (first["a_token"], first["b_token"]) == ("b", "g")
    assert (second["first_diverging_position"], second["a_token"], second["b_token"]) == (2, "c", None)


def test_token_gate_prefers_token_ids_and_checks_records_match():
    a = {"prompts": ["p"], "settings": {"max_tokens": 4}, "answers": [{"text": "x y", "token_ids": [1, 2]}]}
    b = {"prompts": ["p"], "settings": {"max_tokens": 4}, "answers": [{"text": "x y", "token_ids": [1, 3]}]}
    got = ops.token_gate(a, b)
    assert got["compared_by"] == ["token_ids"] and got["mismatches"][0]["first_diverging_position"] == 1
    with pytest.raises(PdError) as info:
        ops.token_gate(a, dict(b, prompts=["q"]))
    assert info.value.field == "prompts"
    with pytest.raises(PdError) as info:
        ops.token_gate(a, dict(b, settings={"max_tokens": 8}))
    assert info.value.field == "settings"
    with pytest.raises(PdError):
        ops.token_gate([[1]], [[1], [2]])


def test_gate_answers_reads_text_and_token_ids_and_names_failed_prompts():
    results = [
        {"status": 200, "json": {"choices": [{"text": "a b", "token_ids": [5, 6]}]}},
        {"status": 200, "json": {"choices": [{"text": "c", "logprobs": {"tokens": ["token_id:7"]}}]}},
        {"status": 200, "json": {"choices": [{"message": {"content": "chat"}}]}},
    ]
    assert ops.gate_answers(results) == [{"text": "a b", "token_ids": [5, 6]}, {"text": "c", "token_ids": [7]},
                                         {"text": "chat", "token_ids": None}]
    with pytest.raises(PdError) as info:
        ops.gate_answers(results + [{"status": 503, "msg": "engine is not ready"}])
    assert "prompt 3: HTTP 503 engine is not ready" in str(info.value)


# ---- one change ---------------------------------------------------------------------------------

def test_one_change_names_the_single_changed_parameter():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    assert ops.one_change(CLUSTER, after) == {"path": "prefill.engine.max_num_batched_tokens", "old": 8192,
                                              "new": 32768, "kind": "changed"}


def test_one_change_refuses_two_changes_and_names_both():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    after["decode"]["engine"]["max_num_seqs"] = 32
    with pytest.raises(PdError) as info:
        ops.one_change(CLUSTER, after)
    text = str(info.value)
    assert "2 parameters changed" in text
    assert "prefill.engine.max_num_batched_tokens: 8192 -> 32768" in text
    assert f"decode.engine.max_num_seqs: {D_SEQS} -> 32" in text


def test_one_change_refuses_no_change_and_ignores_cosmetic_edits():
    cosmetic = copy.deepcopy(CLUSTER)
    cosmetic["decode"]["engine"]["max_num_seqs"] = D_SEQS      # the default, now explicit
    with pytest.raises(PdError) as info:
        ops.one_change(CLUSTER, cosmetic)
    assert "nothing changed" in str(info.value)
    before = dict(copy.deepcopy(CLUSTER), decode=dict(CLUSTER["decode"], cpu_offload="200GiB",
                                                      offload_connector="RecomputeCPUOffloadConnector",
                                                      recompute_scheduler=True))
    after = copy.deepcopy(before)
    after["decode"]["cpu_offload"] = "128GiB"
    change = ops.one_change(before, after)
    assert change == {"path": "decode.cpu_offload", "old": 200 * GIB, "new": 128 * GIB, "kind": "changed"}
    assert ops.tune_check(change, "decode.cpu_offload", "128GiB") == change
    # a raw diff sees the edited keys as written
    assert ops.diff_paths({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, effective=False) == [
        {"path": "a.c", "old": None, "new": 2, "kind": "added"}]


def test_one_change_compares_values_not_exact_types():
    """Ansible passes tagged subclasses of str/int; they must compare equal to plain values."""
    class TaggedStr(str):
        pass

    class TaggedInt(int):
        pass

    after = copy.deepcopy(CLUSTER)
    after["image"] = TaggedStr(CLUSTER["image"])
    after["prefill"]["engine"]["max_num_batched_tokens"] = TaggedInt(32768)
    assert ops.one_change(CLUSTER, after)["path"] == "prefill.engine.max_num_batched_tokens"
    flag = copy.deepcopy(CLUSTER)
    flag["prefill"]["engine"]["enforce_eager"] = 0       # a number where a bool was: a change
    assert ops.diff_paths(dict(CLUSTER, prefill={"engine": {"enforce_eager": False}}), flag)[0]["path"] == \
        "prefill.engine.enforce_eager"


def test_tune_check_wants_the_declared_parameter_and_value():
    after = copy.deepcopy(CLUSTER)
    after["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    change = ops.one_change(CLUSTER, after)
    assert ops.tune_check(change, "prefill.engine.max_num_batched_tokens", "32768")["new"] == 32768
    with pytest.raises(PdError) as info:
        ops.tune_check(change, "decode.engine.max_num_seqs", "32")
    assert "prefill.engine.max_num_batched_tokens" in str(info.value)
    with pytest.raises(PdError) as info:
        ops.tune_check(change, "prefill.engine.max_num_batched_tokens", "24576")
    assert info.value.field == "pd_tune_value"


def test_spec_hashes_and_running_drift():
    hashes = ops.spec_hashes(PLAN, "c1")
    proxy = PLAN["clusters"]["c1"]["proxy"]
    assert set(hashes) == {"c1-p0", "c1-d0"}
    assert proxy["name"] in hashes[proxy["host"]]
    expected = hashes["c1-d0"]
    names = list(expected)
    info = [{"item": names[0], "exists": True, "container": {"State": {"Running": True},
                                                            "Config": {"Labels": {"pd.spec-hash": expected[names[0]]}}}},
            {"item": names[1], "exists": True, "container": {"State": {"Running": True},
                                                            "Config": {"Labels": {"pd.spec-hash": "0" * 64}}}}]
    drift = ops.running_drift(expected, info)
    assert drift == [f"{names[1]}: runs spec {'0' * 12} but {expected[names[1]][:12]} was recorded"]
    assert ops.running_drift(expected, info[:1]) == [f"{names[1]}: not present"]


# ---- baseline -----------------------------------------------------------------------------------

def test_baseline_spec_drops_the_connectors_and_swaps_max_model_len():
    raw = copy.deepcopy(CLUSTER)
    raw["decode"].update({"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                          "recompute_scheduler": True})
    spec = plan_of(raw)["hosts"]["c1-d0"]["specs"][0]
    assert "--kv-transfer-config" in spec["command"] and "--additional-config" in spec["command"]
    bare = ops.baseline_spec(spec, 16384)
    assert bare["name"] == spec["name"] + "-baseline"
    assert "--kv-transfer-config" not in bare["command"] and "--additional-config" not in bare["command"]
    i = bare["command"].index("--max-model-len")
    assert bare["command"][i + 1] == "16384" and bare["command"].count("--max-model-len") == 1
    assert "--no-disable-hybrid-kv-cache-manager" in bare["command"]
    kept = [a for a in spec["command"] if not a.startswith("{")]
    kept = [a for a in kept if a not in ("--kv-transfer-config", "--additional-config")]
    j = kept.index("--max-model-len")
    del kept[j:j + 2]
    assert sorted(a for a in bare["command"] if a not in ("--max-model-len", "16384")) == sorted(kept)
    assert (bare["devices"], bare["image"], bare["env"]) == (spec["devices"], spec["image"], spec["env"])
    assert bare["restart_policy"] == "no" and bare["pinned_offload_bytes"] == 0
    assert bare["labels"]["pd.baseline"] == "true" and bare["labels"]["pd.managed-by"] == "pd-deploy"
    assert spec["name"].endswith("dp0") and "pd.spec-hash" in spec["labels"], "the input spec is not changed"
    with pytest.raises(PdError):
        ops.baseline_spec(PLAN["clusters"]["c1"]["proxy"], 16384)


FIXED = 512 * MIB
MARGINAL = 3300
LENGTHS = (16384, 65536)


def test_two_boots_are_fitted_back_to_the_footprint_that_made_them():
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL), "name": "r0", "role": "decode"}
             for L in LENGTHS]
    report = ops.baseline_report(boots, config=CLUSTER)
    fit = report["fits"]["decode"]["fit"]
    # vLLM prints GiB and concurrency with two decimals: the fit is exact to that precision
    assert fit["marginal_bytes_per_token"] == pytest.approx(MARGINAL, rel=0.01)
    assert fit["fixed_bytes_per_request"] == pytest.approx(FIXED, rel=0.01)
    assert report["fits"]["decode"]["judge"]["verdict"] == "ok"
    assert report["verdict"]["verdict"] == "ok" and "two-point fit" in report["verdict"]["basis"]
    for row, L in zip(report["boots"], LENGTHS):
        concurrency = 30 * GIB / (FIXED + MARGINAL * L)
        assert row["max_concurrency"] == pytest.approx(concurrency, abs=0.005)
        assert row["kv_tokens_per_dp_group"] == int(concurrency * L)
        assert row["bytes_per_token"] == pytest.approx(30 * GIB / int(concurrency * L))
        # the start-up "one request needs ~X" = max_model_len x single ratio = the footprint at that length
        assert row["startup_reservation_bytes"] == pytest.approx(FIXED + MARGINAL * L, rel=0.01)
    # the single ratio moves with max-model-len (DOMAIN.md §5); the fit does not
    assert report["boots"][0]["bytes_per_token"] > report["boots"][1]["bytes_per_token"]
    requests = {q["what"]: q for q in report["fits"]["decode"]["requests"]}
    p99 = requests["P99 request (prompt + output)"]
    assert p99["tokens"] == P99
    assert p99["true_bytes"] == pytest.approx(FIXED + MARGINAL * P99, rel=0.01)
    assert p99["requests_per_worker"] == int(30 * GIB // p99["true_bytes"])
    configured = requests["configured max_model_len"]
    assert configured["tokens"] == CLUSTER["decode"]["engine"]["max_model_len"]


def test_a_log_ten_times_over_the_band_flags_the_hybrid_manager():
    band = ops.model_band("deepseek_v4_flash")
    marginal = 10 * band["max"]
    boots = [{"max_model_len": L, "log_text": vllm_log(L, 0, marginal, available_gib=60)} for L in LENGTHS]
    report = ops.baseline_report(boots)
    fit = report["fits"]["all"]["fit"]
    assert fit["marginal_bytes_per_token"] == pytest.approx(marginal, rel=0.01)
    assert report["verdict"]["verdict"] == "far_high"
    assert "hybrid" in report["verdict"]["message"] and "hybrid" in report["verdict"]["likely_cause"]
    md = ops.baseline_markdown(report, "c1", {"vllm_ascend_version": "0.25.1"})
    assert "far_high" in md and "- vllm_ascend_version: 0.25.1" in md


def test_a_band_override_changes_the_judgement():
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, 12000)} for L in LENGTHS]
    assert ops.baseline_report(boots)["verdict"]["verdict"] == "high"
    bf16 = {"min": 4096, "max": 16384, "source": "bf16 KV cache, our own two-point fit"}
    assert ops.baseline_report(boots, band=bf16)["verdict"]["verdict"] == "ok"


def test_one_length_only_gives_no_fit_and_a_hint_verdict():
    report = ops.baseline_report([{"max_model_len": 32768, "log_text": vllm_log(32768, FIXED, MARGINAL)}])
    assert report["fits"]["all"]["fit"] is None
    assert "second length" in report["fits"]["all"]["note"]
    assert "single ratio" in report["verdict"]["basis"]


def test_a_boot_whose_log_is_of_another_length_is_refused():
    with pytest.raises(PdError) as info:
        ops.baseline_report([{"max_model_len": 16384, "log_text": vllm_log(32768, FIXED, MARGINAL)}])
    assert "not 16384" in str(info.value)


def _frames(text, stream=1):
    """A log body as the Docker API sends it without a TTY: 8-byte header + payload per line."""
    out = b""
    for line in text.splitlines(keepends=True):
        payload = line.encode()
        out += bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
    return out


def test_docker_log_frames_are_removed_whatever_their_size_bytes():
    import base64

    long_line = "x" * 200 + " é\n"                                   # 204 bytes: size byte 0xcc
    log = vllm_log(16384, FIXED, MARGINAL) + long_line
    body = _frames(log)
    assert bytes([0, 0, 0, len(long_line.encode())]) in body and len(long_line.encode()) >= 0x80
    assert ops.docker_log_text(body) == log
    # text as Ansible hands it over: undecodable header bytes surrogate-escaped
    assert ops.docker_log_text(body.decode("utf-8", "surrogateescape")) == log
    assert ops.docker_log_text(log.encode()) == log                   # a TTY container: raw stream
    spec = PLAN["hosts"]["c1-d0"]["specs"][0]
    slurped = [{"item": {"item": spec, "status": 200}, "content": base64.b64encode(body).decode(), "encoding": "base64"}]
    assert ops.docker_logs(slurped) == {spec["name"]: log}


def test_baseline_boots_from_the_bare_engines_logs():
    rank = PLAN["hosts"]["c1-d0"]["specs"][0]
    bare = ops.baseline_spec(rank, 16384)
    boots = ops.baseline_boots([bare], {bare["name"]: vllm_log(16384, FIXED, MARGINAL)}, 16384)
    assert boots[0]["name"] == rank["name"] and boots[0]["role"] == "decode"
    assert logparse.parse_startup_log(boots[0]["log_text"])["concurrency_len"] == 16384
    with pytest.raises(PdError) as info:
        ops.baseline_boots([bare], {}, 16384)
    assert info.value.field == bare["name"]
    message = ops.baseline_failure([bare], {bare["name"]: "ValueError: To serve at least one request"}, "h1")
    assert "h1: 1 bare engine(s) never became healthy" in message and "ValueError" in message


# ---- capacity -----------------------------------------------------------------------------------

def test_capacity_report_uses_the_measured_fit_and_says_so():
    summary = PLAN["clusters"]["c1"]
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    baseline = ops.baseline_report(boots)
    report = ops.capacity_report(summary, baseline, CLUSTER)
    assert report["source"] == "measured"
    d = report["roles"]["decode"]
    cap = summary["capacity"]["decode"]
    fit = baseline["fits"]["all"]["fit"]
    per_worker = cap["kv_budget_per_dp_group_bytes"] // cap["tp"]
    footprint = fit["fixed_bytes_per_request"] + fit["marginal_bytes_per_token"] * P99
    assert d["kv_budget_per_worker_bytes"] == per_worker
    assert d["footprint_at_p99_bytes"] == round(footprint)
    assert d["requests_fit_per_dp_group_at_p99"] == int(per_worker // footprint)
    need = cap["max_num_seqs_per_dp_group"] * footprint * cap["tp"]
    mem = d["memory_at_configured_concurrency"]
    assert mem["per_dp_group_bytes"] == round(need)
    assert mem["per_instance_bytes"] == round(need * cap["dp"])
    assert mem["max_num_seqs_that_fit"] == int(per_worker // footprint)
    assert "measured" in d["bytes_model"]["source"]
    p = report["roles"]["prefill"]["expected_concurrency"]
    assert p["configured"]["concurrency"] == max(1, min(32 * 2, 8192 // 16384))
    rec = capacity.recommend_batched_tokens(16384, tp=4)["recommended"]
    assert p["recommended"]["concurrency"] == max(1, min(32 * 2, rec // 16384))
    assert "| D memory at configured concurrency (instance) |" in report["markdown"]


def test_capacity_report_without_baseline_uses_the_configured_estimate():
    report = ops.capacity_report(PLAN["clusters"]["c1"], None, CLUSTER)
    est = ops.model_estimate("deepseek_v4_flash")
    assert report["source"] == "estimate"
    assert report["roles"]["decode"]["bytes_model"]["marginal_bytes_per_token"] == est["marginal_bytes_per_token"]
    assert "configured estimate" in report["roles"]["decode"]["bytes_model"]["source"]
    assert any("unknown until playbooks/baseline.yml" in n for n in report["roles"]["decode"]["notes"])
    # without the cluster's config the defaults' workload is used
    assert ops.capacity_report(PLAN["clusters"]["c1"])["workload"] == model.defaults()["cluster"]["workload"]
    with pytest.raises(PdError):
        ops.capacity_report({"capacity": None})


def test_capacity_warns_when_d_concurrency_cannot_fit():
    raw = copy.deepcopy(CLUSTER)
    raw["decode"]["engine"]["max_num_seqs"] = 256
    baseline = ops.baseline_report([{"max_model_len": L, "log_text": vllm_log(L, 2 * GIB, MARGINAL)} for L in LENGTHS])
    report = ops.capacity_report(plan_of(raw)["clusters"]["c1"], baseline, raw)
    d = report["roles"]["decode"]
    assert d["memory_at_configured_concurrency"]["share_of_budget"] > 1
    assert any("expect preemptions" in n for n in d["notes"])


def test_capacity_chart_is_well_formed_svg_with_a_bar_per_figure():
    report = ops.capacity_report(PLAN["clusters"]["c1"], None, CLUSTER)
    svg = ops.capacity_chart_svg(report)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    bars = [r for r in root.iter(f"{ns}rect")][1:]      # the first rect is the background
    assert len(bars) == 3 * len(report["roles"])
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert "decode: KV budget per DP group" in labels
    budget = report["roles"]["decode"]["kv_budget_per_dp_group_bytes"]
    assert f"{budget / GIB:.1f}" in labels
    hostile = dict(report, cluster="<a&b>")
    ET.fromstring(ops.capacity_chart_svg(hostile))


# ---- monitoring ---------------------------------------------------------------------------------

def test_scrape_config_lists_every_rank_and_probes_the_proxy():
    two = copy.deepcopy(CLUSTER)
    two["name"] = "c2"
    two.update(proxy={"port": 9000}, prefill=dict(two["prefill"], port_base=9100, kv_port=29000, dp_rpc_port=14389),
               decode=dict(two["decode"], port_base=9200, kv_port=29100, dp_rpc_port=14399))
    fleet_plan = plan_of(CLUSTER)
    other = plan_of(two, ("c2-p0",), ("c2-d0",))
    fleet_plan["clusters"].update(other["clusters"])
    fleet_plan["hosts"].update(other["hosts"])
    config = ops.prometheus_scrape_config(fleet_plan)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"pd-c1", "pd-c1-proxy", "pd-c2", "pd-c2-proxy"}
    for cluster in ("c1", "c2"):
        specs = [s for h in fleet_plan["clusters"][cluster]["hosts"] for s in fleet_plan["hosts"][h]["specs"]]
        got = {(t["targets"][0], t["labels"]["instance"], t["labels"]["role"], t["labels"]["dp_rank"])
               for t in jobs[f"pd-{cluster}"]["static_configs"]}
        want = {(f"{s['env']['HCCL_IF_IP']}:{s['ports']['http']}", s["name"], s["role"], str(s["dp_rank"]))
                for s in specs}
        assert got == want and len(specs) == 4
        assert all(t["labels"]["cluster"] == cluster for t in jobs[f"pd-{cluster}"]["static_configs"])
        proxy = fleet_plan["clusters"][cluster]["proxy"]
        probe = jobs[f"pd-{cluster}-proxy"]
        assert probe["static_configs"][0]["targets"][0].endswith(f":{proxy['ports']['http']}/healthcheck")
        assert probe["relabel_configs"][-1]["replacement"] == "127.0.0.1:9115"
    yaml.safe_load(yaml.safe_dump(config))


def test_dashboard_has_a_panel_per_pitfall_signal():
    dash = ops.grafana_dashboard(PLAN)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    assert "vllm:num_requests_running" in exprs["Requests running"]
    assert "vllm:num_requests_waiting" in exprs["Requests waiting"]
    assert "vllm:kv_cache_usage_perc" in exprs["KV cache usage"]
    assert "rate(vllm:num_preemptions_total" in exprs["Preemptions per second"]
    ttft = exprs["Time to first token p50 / p95"]
    assert "histogram_quantile(0.5," in ttft and "histogram_quantile(0.95," in ttft
    assert "vllm:time_to_first_token_seconds_bucket" in ttft
    assert "probe_success" in exprs["Proxy up"]
    kv = next(p for p in dash["panels"] if p["title"] == "KV cache usage")
    assert {"color": "red", "value": 0.9} in kv["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    json.dumps(dash)


# ---- filters: registration, purity, Jinja --------------------------------------------------------

def _plugin_filters():
    spec = importlib.util.spec_from_file_location("pd_plugin_for_ops", os.path.join(REPO, "filter_plugins", "pd.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


@pytest.mark.parametrize("name", sorted(ops.FILTERS))
def test_every_ops_filter_is_a_pd_named_documented_function(name):
    assert name.startswith("pd_")
    assert (ops.FILTERS[name].__doc__ or "").strip()


def test_ops_filters_are_registered_in_the_plugin():
    filters = _plugin_filters()
    for name, func in ops.FILTERS.items():
        assert filters.get(name) is func


def test_calls_do_not_change_their_inputs_or_depend_on_earlier_calls():
    samples = [page({"preemptions": 0, "kv": 0.95}), page({"preemptions": 3, "kv": 0.95})]
    raw = copy.deepcopy(CLUSTER)
    plan = copy.deepcopy(PLAN)
    first = ops.diagnose(samples, "decode", raw)
    assert ops.diagnose(samples, "decode", raw) == first
    assert raw == CLUSTER and plan == PLAN
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    assert ops.baseline_report(boots) == ops.baseline_report(copy.deepcopy(boots))
    report = ops.capacity_report(plan["clusters"]["c1"], None, raw)
    assert ops.capacity_report(plan["clusters"]["c1"], None, raw) == report
    assert ops.prometheus_scrape_config(plan) == ops.prometheus_scrape_config(plan)
    assert plan == PLAN
    ops.models()["deepseek_v4_flash"]["bytes_per_token"]["max"] = 1
    assert ops.model_band()["max"] > 1


def test_filters_work_through_jinja_native_templates():
    env = NativeEnvironment()
    env.filters.update(ops.FILTERS)
    samples = [page({"preemptions": 0}), page({"preemptions": 3})]
    out = env.from_string("{{ (samples | pd_diagnose('decode', cluster) | pd_verdict).status }}").render(
        samples=samples, cluster=CLUSTER)
    assert out == "critical"
    parsed = env.from_string("{{ text | pd_parse_metrics }}").render(text=samples[1])
    assert parsed["num_preemptions"] == 3


# ---- the playbooks against stand-ins on 127.0.0.1 ------------------------------------------------

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def _inventory(tmp_path, p_port, d_port, proxy_port):
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": {"pd_clusters": {"children": {"t1": {"hosts": {"t1-p0": None, "t1-d0": None}}}},
                     "prefill": {"hosts": {"t1-p0": None}}, "decode": {"hosts": {"t1-d0": None}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "pd_host_address": "127.0.0.1", "pd_npus": 8, "pd_host_ram": "512GiB", "pd_hccl_if": "lo"}}}))
    raw = {"name": "t1", "vllm_ascend_version": "0.25.1", "image": "quay.io/ascend/vllm-ascend:v0.25.1",
           "model": {"path": "/data/models/DeepSeek-V4-Flash"}, "proxy": {"port": proxy_port},
           "prefill": {"dp": 1, "tp": 8, "port_base": p_port, "kv_port": 28000},
           "decode": {"dp": 1, "tp": 8, "port_base": d_port, "kv_port": 28100}}
    (inv / "group_vars" / "t1.yml").write_text(yaml.safe_dump({"pd_cluster": raw}))
    return inv, raw


def _run(playbook, inventory, tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    cmd = [ANSIBLE_PLAYBOOK, os.path.join(REPO, "playbooks", playbook), "-i", str(inventory),
           "-e", f"pd_plan_build_dir={tmp_path / 'build'}", "-e", f"pd_ops_reports_dir={tmp_path / 'reports'}", *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def standins():
    servers = {"prefill": StandIn(), "decode": StandIn(), "proxy": StandIn()}
    yield servers
    for server in servers.values():
        server.close()


@pytest.mark.ansible
def test_health_check_playbook_reports_preemptions_and_fails_on_critical_when_asked(tmp_path, standins):
    inv, raw = _inventory(tmp_path, standins["prefill"].port, standins["decode"].port, standins["proxy"].port)
    pages = [page({"preemptions": 0}), page({"preemptions": 3})]
    standins["decode"].reset(pages)
    standins["prefill"].reset([page({"running": 1, "waiting": 2})])
    args = ("-e", "pd_ops_scrape_interval=0", "-e", f"pd_ops_docker_socket={tmp_path / 'no-docker.sock'}")
    done = _run("health-check.yml", inv, tmp_path, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    health = json.loads((tmp_path / "reports" / "t1" / "health.json").read_text())
    seqs = model.normalize("t1", copy.deepcopy(raw))["roles"]["decode"]["engine"]["max_num_seqs"]
    assert health["verdict"]["status"] == "critical"
    preempt = [f for f in health["findings"] if f["signal"] == "vllm:num_preemptions"]
    assert preempt and f"lower decode.engine.max_num_seqs from {seqs} to {seqs * 3 // 4}" in preempt[0]["action"]
    stuck = [f for f in health["findings"] if f["signal"] == "vllm:num_requests_running"]
    assert stuck and "raise prefill.engine.max_num_batched_tokens" not in stuck[0]["action"]  # 32768 already fits
    assert "t1: CRITICAL" in done.stdout
    for server in standins.values():
        server.reset()
    failed = _run("health-check.yml", inv, tmp_path, *args, "-e", "pd_health_fail_on_critical=true")
    assert failed.returncode != 0
    assert "Critical findings in t1" in failed.stdout


@pytest.mark.ansible
def test_token_gate_playbook_fails_on_one_changed_token_and_passes_on_equal(tmp_path):
    prompts = ["first prompt", "second prompt", "third prompt"]
    (tmp_path / "prompts.yml").write_text(yaml.safe_dump({"max_tokens": 6, "seed": 0, "prompts": prompts}))
    a, b = StandIn(), StandIn(shift={"second prompt": 2})
    try:
        inv, _ = _inventory(tmp_path, 40011, 40012, a.port)
        common = ("-e", f"pd_gate_prompts_file={tmp_path / 'prompts.yml'}")
        failed = _run("token-gate.yml", inv, tmp_path, *common, "-e", f"pd_gate_a_url=http://127.0.0.1:{a.port}",
                      "-e", f"pd_gate_b_url=http://127.0.0.1:{b.port}")
        assert failed.returncode != 0
        result = json.loads((tmp_path / "reports" / "t1" / "gate-result.json").read_text())
        words = answer_words("second prompt", 6)
        pos = sum(len(w) + 1 for w in words[:2]) + len(words[2])  # the 'x' appended to the 3rd word
        assert result["passed"] is False
        assert [(m["prompt_index"], m["first_diverging_position"]) for m in result["mismatches"]] == [(1, pos)]
        assert f"prompt 1: first difference at character {pos}" in failed.stdout
        for label in ("before", "after"):   # default endpoint: the cluster's proxy (here: stand-in A)
            rec = _run("token-gate.yml", inv, tmp_path, *common, "-e", "pd_gate_mode=record", "-e", f"pd_gate_label={label}")
            assert rec.returncode == 0, rec.stdout + rec.stderr
        cmp_ = _run("token-gate.yml", inv, tmp_path, *common, "-e", "pd_gate_mode=compare",
                    "-e", "pd_gate_before=before", "-e", "pd_gate_after=after")
        assert cmp_.returncode == 0, cmp_.stdout + cmp_.stderr
        record = json.loads((tmp_path / "reports" / "t1" / "gate-before.json").read_text())
        assert record["prompts"] == prompts and len(record["answers"]) == 3
    finally:
        a.close()
        b.close()


@pytest.mark.ansible
def test_capacity_and_monitoring_playbooks_write_their_files(tmp_path):
    inv, raw = _inventory(tmp_path, 40021, 40022, 40023)
    done = _run("capacity-report.yml", inv, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "reports" / "t1"
    assert json.loads((out / "capacity.json").read_text())["source"] == "estimate"
    assert "# Capacity of t1 (estimate)" in (out / "capacity.md").read_text()
    ET.fromstring((out / "capacity.svg").read_text())
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    (out / "baseline.json").write_text(json.dumps(ops.baseline_report(boots, config=raw)))
    again = _run("capacity-report.yml", inv, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((out / "capacity.json").read_text())["source"] == "measured"
    mon = _run("monitoring.yml", inv, tmp_path, "-e", f"pd_monitoring_dir={tmp_path / 'monitoring'}")
    assert mon.returncode == 0, mon.stdout + mon.stderr
    prom = yaml.safe_load((tmp_path / "monitoring" / "prometheus.yml").read_text())
    targets = [t["targets"][0] for t in prom["scrape_configs"][0]["static_configs"]]
    assert sorted(targets) == ["127.0.0.1:40021", "127.0.0.1:40022"]
    dash = json.loads((tmp_path / "monitoring" / "grafana-dashboard.json").read_text())
    assert len(dash["panels"]) == 6


def test_load_script_against_a_stand_in_proxy():
    spec = importlib.util.spec_from_file_location("pd_load", os.path.join(REPO, "roles", "pd_ops", "files", "pd_load.py"))
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    proxy = StandIn()
    try:
        out = load.run(load_args(load, proxy.port))
    finally:
        proxy.close()
    assert (out["requests"], out["ok"], out["failed"]) == (6, 6, 0)
    assert out["throughput_tokens_per_s"] > 0 and out["latency_p50_s"] is not None
    assert math.isfinite(out["seconds"])


def load_args(load, port):
    import argparse

    return argparse.Namespace(url=f"http://127.0.0.1:{port}/v1/completions", model="m", requests=6, concurrency=3,
                              max_tokens=4, prompt_tokens=16, timeout=10)
