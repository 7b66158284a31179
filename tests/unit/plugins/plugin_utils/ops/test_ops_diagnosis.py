"""plugin_utils.ops.diagnosis: the pitfall table applied to a rank's scrapes and log, verdicts, and the
health-check adapters of Ansible loop results.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import diagnosis
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.ops_inputs import CLUSTER, D_SEQS, NORM, P99, PLAN, StandIn, page
from tests.fixtures.real_metrics import PAGES, by_source, real_page


def _one(findings, signal):
    hits = [f for f in findings if f["signal"] == signal]
    assert len(hits) == 1, findings
    return hits[0]


def test_preemptions_growing_on_decode_ask_for_fewer_seqs_or_recompute_offload():
    findings = diagnosis.diagnose([page({"preemptions": 0}), page({"preemptions": 3})], "decode", CLUSTER)
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
    f = _one(diagnosis.diagnose([page({"preemptions": 0}), page({"preemptions": 1})], "decode", raw),
             "vllm:num_preemptions")
    assert "add decode.offload_connector" not in f["action"]


def test_old_preemptions_only_warn_and_a_single_scrape_above_zero_is_critical():
    steady = diagnosis.diagnose([page({"preemptions": 5}), page({"preemptions": 5})], "decode", CLUSTER)
    assert _one(steady, "vllm:num_preemptions")["severity"] == "warning"
    single = diagnosis.diagnose([page({"preemptions": 1})], "decode", CLUSTER)
    assert _one(single, "vllm:num_preemptions")["severity"] == "critical"
    assert diagnosis.diagnose([page(), page()], "decode", CLUSTER) == []


def test_kv_usage_095_sustained_asks_for_offload_or_a_p99_max_model_len():
    findings = diagnosis.diagnose([page({"kv": 0.95}), page({"kv": 0.95})], "decode", CLUSTER)
    f = _one(findings, "vllm:kv_cache_usage_perc")
    assert f["severity"] == "warning"
    assert "0.95" in f["value"]
    assert "RecomputeCPUOffloadConnector" in f["action"]
    assert f["change"] == {"param": "decode.engine.max_model_len", "value": P99}


def test_kv_usage_high_once_is_only_a_note_and_below_the_line_is_nothing():
    once = diagnosis.diagnose([page({"kv": 0.5}), page({"kv": 0.95})], "decode", CLUSTER)
    assert _one(once, "vllm:kv_cache_usage_perc")["severity"] == "info"
    assert diagnosis.diagnose([page({"kv": 0.95}), page({"kv": 0.5})], "decode", CLUSTER) == []
    three = diagnosis.diagnose([page({"kv": 0.95})] * 3, "decode", CLUSTER, sustain=3)
    assert _one(three, "vllm:kv_cache_usage_perc")["severity"] == "warning"


def test_prefill_running_1_with_5_waiting_raises_batched_tokens_to_the_table_value():
    findings = diagnosis.diagnose([page({"running": 1, "waiting": 5}), page({"running": 1, "waiting": 5})],
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
    f = _one(diagnosis.diagnose([first, second], "prefill", CLUSTER), "vllm:num_requests_running")
    want = capacity.recommend_batched_tokens(avg_measured, tp=4)["recommended"]
    assert f"to {want}" in f["action"]
    assert f"measured average prompt {avg_measured}" in f["value"]


def test_running_1_with_a_queue_is_not_a_decode_signal_and_needs_the_queue():
    assert diagnosis.diagnose([page({"running": 1, "waiting": 5})] * 2, "decode", CLUSTER) == []
    assert diagnosis.diagnose([page({"running": 1, "waiting": 0})] * 2, "prefill", CLUSTER) == []
    assert diagnosis.diagnose([page({"running": 1, "waiting": 5}), page({"running": 3, "waiting": 5})],
                        "prefill", CLUSTER) == []


def test_ttft_growing_on_prefill_lowers_batched_tokens_one_step():
    raw = copy.deepcopy(CLUSTER)
    raw["prefill"]["engine"]["max_num_batched_tokens"] = 32768
    before = [0.2] * 10                     # mean 0.2 s
    window = [0.9] * 10                     # mean 0.9 s > 1.5 x 0.2
    findings = diagnosis.diagnose([page({"ttft": before}), page({"ttft": before + window})], "prefill", raw)
    f = _one(findings, "vllm:time_to_first_token_seconds")
    assert f["severity"] == "warning"
    assert "lower prefill.engine.max_num_batched_tokens from 32768 to 24576" in f["action"]
    assert f["change"] == {"param": "prefill.engine.max_num_batched_tokens", "value": 24576}
    steady = diagnosis.diagnose([page({"ttft": before}), page({"ttft": before + [0.21] * 10})], "prefill", raw)
    assert [x for x in steady if x["signal"] == "vllm:time_to_first_token_seconds"] == []


def test_ttft_growing_behind_a_stuck_prefill_does_not_ask_to_lower_the_batch():
    before, window = [0.2] * 10, [0.9] * 10
    stuck = [page({"running": 1, "waiting": 5, "ttft": before}), page({"running": 1, "waiting": 7, "ttft": before + window})]
    findings = diagnosis.diagnose(stuck, "prefill", CLUSTER)
    assert _one(findings, "vllm:num_requests_running")["severity"] == "critical"
    ttft = _one(findings, "vllm:time_to_first_token_seconds")
    assert ttft["severity"] == "info" and ttft["change"] is None
    assert "lower prefill.engine.max_num_batched_tokens from" not in ttft["action"]


def test_recompute_lines_in_the_decode_log_are_counted():
    line = "(EngineCore_DP0 pid=7) INFO [recompute_scheduler.py:301] [RecomputeScheduler] Recompute triggered for request cmpl-{}"
    log = "\n".join([line.format(i) for i in range(3)] + ["INFO other line"])
    assert diagnosis.count_recompute(log) == 3
    assert diagnosis.count_recompute(log.splitlines()) == 3
    no_pool = _one(diagnosis.diagnose([page()], "decode", CLUSTER, log_text=log), "log: [RecomputeScheduler] Recompute triggered")
    assert no_pool["severity"] == "warning" and no_pool["value"] == 3
    raw = copy.deepcopy(CLUSTER)
    raw["decode"].update({"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                          "recompute_scheduler": True})
    pooled = _one(diagnosis.diagnose([page()], "decode", raw, log_text=log), "log: [RecomputeScheduler] Recompute triggered")
    assert pooled["severity"] == "info"


def test_an_oom_in_the_prefill_log_goes_back_to_a_smaller_batch():
    raw = copy.deepcopy(CLUSTER)
    raw["prefill"]["engine"]["max_num_batched_tokens"] = 49152
    f = _one(diagnosis.diagnose([page()], "prefill", raw, log_text="RuntimeError: NPU out of memory. Tried to allocate"),
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
        diagnosis.diagnose(*args)
    assert info.value.field == field


def test_verdict_is_the_worst_severity_with_each_action_once():
    crit = diagnosis.diagnose([page({"preemptions": 0}), page({"preemptions": 3})], "decode", CLUSTER)
    note = diagnosis.diagnose([page({"kv": 0.5}), page({"kv": 0.95})], "decode", CLUSTER)
    v = diagnosis.verdict(note + crit + crit)
    assert v["status"] == "critical"
    assert (v["critical"], v["warning"], v["info"]) == (2, 0, 1)
    assert v["actions"][0] == crit[0]["action"] and len(v["actions"]) == 2
    assert v["changes"] == [crit[0]["change"]]
    assert diagnosis.verdict([])["status"] == "ok"
    with pytest.raises(PdError):
        diagnosis.verdict([{"severity": "fatal"}])


def _uri(spec, content, status=200):
    return {"item": spec, "status": status, "content": content}


def test_health_ranks_and_clusters_from_ansible_loop_results():
    specs = PLAN["hosts"]["c1-d0"]["specs"]
    first = [_uri(s, page({"preemptions": 0})) for s in specs]
    second = [_uri(specs[0], page({"preemptions": 3})),
              {"item": specs[1], "status": -1, "msg": "Status code was -1 and not [200]: Request failed: "
                                                     "<urlopen error [Errno 111] Connection refused>"}]
    logs = {s["name"]: "plain line\n" for s in specs}
    ranks = diagnosis.health_ranks(specs, first, second, logs, CLUSTER)
    assert [r["name"] for r in ranks] == [s["name"] for s in specs]
    assert ranks[0]["reachable"] and ranks[0]["verdict"]["status"] == "critical"
    assert ranks[0]["window"]["preemptions"] == 3 and ranks[0]["recompute_lines"] == 0
    assert not ranks[1]["reachable"]
    down_rank = _one(ranks[1]["findings"], "GET /metrics")
    assert down_rank["severity"] == "critical" and down_rank["value"] == "no answer (Connection refused)"
    assert len(ranks[1]["findings"]) == 1, "a half window is not diagnosed"
    proxy = PLAN["clusters"]["c1"]["proxy"]
    down = diagnosis.health_ranks([], [], [], None, CLUSTER, proxy, {"status": -1})
    assert down[0]["role"] == "proxy" and down[0]["verdict"]["status"] == "critical"
    loaded = diagnosis.health_ranks(specs[:1], first[:1], second[:1], {}, CLUSTER,
                              mid_results=[_uri(specs[0], page({"running": 7, "waiting": 2, "preemptions": 1}))])
    assert len(loaded[0]["samples"]) == 3
    assert loaded[0]["peak"] == {"num_requests_running": 7, "num_requests_waiting": 2, "kv_cache_usage_perc": 0.0}
    summary = diagnosis.metrics_summary(loaded + down, load={"throughput_tokens_per_s": 10.0})
    assert summary["decode"]["running"] == 7 and summary["decode"]["preemptions"] == 3
    assert summary["load"] == {"throughput_tokens_per_s": 10.0} and "proxy" not in summary
    clusters = diagnosis.health_clusters(ranks + down)
    assert list(clusters) == ["c1"]
    c1 = clusters["c1"]
    assert c1["verdict"]["critical"] == 3
    assert any(f"lower decode.engine.max_num_seqs from {D_SEQS} to {D_SEQS * 3 // 4}" in line for line in c1["lines"])
    assert c1["lines"][0].startswith("c1: CRITICAL")


def test_a_scrape_of_a_stand_in_engine_over_loopback_is_diagnosed():
    import urllib.request

    engine = StandIn([page({"kv": 0.95, "preemptions": 0}), page({"kv": 0.96, "preemptions": 2})])
    try:
        url = f"http://127.0.0.1:{engine.port}/metrics"
        samples = [urllib.request.urlopen(url, timeout=5).read().decode() for _ in range(2)]
    finally:
        engine.close()
    findings = diagnosis.diagnose(samples, "decode", CLUSTER)
    assert {f["signal"] for f in findings} == {"vllm:num_preemptions", "vllm:kv_cache_usage_perc"}
    assert diagnosis.verdict(findings)["status"] == "critical"


# ---- the recompute pitfall from D's prompt tokens by source (real pages of vLLM 0.27.1's CPU build)

PITFALL = 'vllm:prompt_tokens_by_source_total{source="local_compute"}'


def test_decode_computing_prompts_itself_is_the_recompute_pitfall():
    # between the scrapes D prefilled a prompt itself (no kv_transfer_params): P's work repeated
    first, second = real_page(PAGES[0]), real_page(PAGES[1])
    grew = by_source(second)["local_compute"] - by_source(first)["local_compute"]
    assert grew > 0
    f = _one(diagnosis.diagnose([first, second], "decode", CLUSTER), PITFALL)
    assert f["severity"] == "critical"  # no token came from P in the window
    assert f"+{grew:g} local_compute" in f["value"]
    assert "recompute pitfall" in f["meaning"]
    assert "decode.mooncake" in f["action"] and "kv_transfer_params" in f["action"]
    assert f["where"] == "c1/decode"


def test_decode_receiving_prompts_from_prefill_is_not_the_pitfall():
    first, second = real_page(PAGES[1]), real_page(PAGES[2])
    assert by_source(second)["external_kv_transfer"] > by_source(first)["external_kv_transfer"]
    findings = diagnosis.diagnose([first, second], "decode", CLUSTER)
    assert [f for f in findings if f["signal"] == PITFALL] == []


def test_the_pitfall_is_a_decode_finding_and_needs_two_scrapes():
    first, second = real_page(PAGES[0]), real_page(PAGES[1])
    assert [f for f in diagnosis.diagnose([first, second], "prefill", CLUSTER) if f["signal"] == PITFALL] == []
    assert [f for f in diagnosis.diagnose([second], "decode", CLUSTER) if f["signal"] == PITFALL] == []


def test_partly_transferred_prompts_are_a_warning():
    first, second = real_page(PAGES[0]), real_page(PAGES[2])
    f = _one(diagnosis.diagnose([first, second], "decode", CLUSTER), PITFALL)
    assert f["severity"] == "warning"
