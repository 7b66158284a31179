"""plugin_utils.ops.metrics: a vLLM /metrics page read into the signals, and the change between two scrapes.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import metrics
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.ops_inputs import page
from tests.fixtures.real_metrics import PAGES, by_source, real_page


def test_parse_metrics_sums_request_gauges_and_counters_and_takes_the_fullest_engine():
    a = {"running": 3, "waiting": 1, "kv": 0.42, "preemptions": 2, "ttft": [0.05, 0.3], "prompt_tokens": 1000}
    b = {"running": 2, "waiting": 4, "kv": 0.91, "preemptions": 5, "ttft": [0.07], "prompt_tokens": 500}
    got = metrics.parse_metrics(page(a, b))
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
    got = metrics.parse_metrics(text)
    assert got["kv_cache_usage_perc"] == 0.5
    assert got["num_requests_running"] == 2
    assert got["num_preemptions"] is None and got["time_to_first_token_seconds"] is None
    assert got["missing"] == ["vllm:num_requests_waiting", "vllm:num_preemptions", "vllm:time_to_first_token_seconds"]


@pytest.mark.parametrize("bad", ["this is { not metrics", 42, None])
def test_parse_metrics_refuses_what_is_not_a_metrics_page(bad):
    with pytest.raises(PdError) as info:
        metrics.parse_metrics(bad)
    assert str(info.value).startswith("pd_parse_metrics: text:")


def test_metrics_window_counts_what_happened_between_scrapes():
    first = page({"preemptions": 1, "ttft": [0.1] * 4, "prompt_tokens": 4 * 1000})
    second = page({"preemptions": 4, "ttft": [0.1] * 4 + [0.7] * 2, "prompt_tokens": 4 * 1000 + 2 * 3000,
                   "running": 2})
    got = metrics.metrics_window(first, second, seconds=10)
    assert got["preemptions"] == 4 - 1
    assert got["requests"] == 2
    assert got["avg_prompt_tokens"] == 3000
    assert got["ttft_mean"] == pytest.approx(0.7)
    assert 0.5 < got["ttft_p50"] <= 0.75
    assert got["num_requests_running"] == 2
    assert got["reset"] is False


def test_metrics_window_treats_a_counter_going_down_as_a_restart():
    got = metrics.metrics_window(page({"preemptions": 9, "ttft": [0.1] * 5}), page({"preemptions": 2, "ttft": [0.2]}))
    assert got["reset"] is True
    assert got["preemptions"] == 2
    assert got["requests"] == 1


# ---- prompt tokens by KV source, on the real engine's pages (vLLM 0.27.1 CPU build)


def test_parse_metrics_reads_prompt_tokens_by_source_from_a_real_page():
    text = real_page(PAGES[1])
    got = metrics.parse_metrics(text)
    assert got["prompt_tokens_by_source"] == by_source(text)
    assert set(got["prompt_tokens_by_source"]) == {"local_compute", "local_cache_hit", "external_kv_transfer"}
    # vLLM: local_compute + local_cache_hit + external_kv_transfer = prompt tokens
    assert sum(got["prompt_tokens_by_source"].values()) == got["prompt_tokens"]
    assert got["missing"] == []


def test_parse_metrics_without_the_by_source_counter_gives_none():
    assert metrics.parse_metrics(page({}))["prompt_tokens_by_source"] is None


@pytest.mark.parametrize("first, second", [(0, 1), (1, 2)])
def test_metrics_window_counts_prompt_tokens_per_source(first, second):
    a, b = real_page(PAGES[first]), real_page(PAGES[second])
    got = metrics.metrics_window(a, b)
    want = {k: v - by_source(a)[k] for k, v in by_source(b).items()}
    assert got["prompt_tokens_by_source"] == want
    assert sum(want.values()) == got["prompt_tokens"]
