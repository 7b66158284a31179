"""Unit tests for plugin_utils.capacity: the article's capacity and tuning arithmetic."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity
from ansible_collections.pd.deploy.plugins.plugin_utils.plan.capacity import (
    DANGER_ZONE,
    SWEET_SPOT,
    UPPER_BOUND,
    batched_tokens_level,
    d_batched_tokens,
    expected_p_concurrency,
    kv_budget,
    kv_tokens,
    recommend_batched_tokens,
    recommend_max_num_seqs,
    retention_interval,
)
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

GiB = 1024**3


# --- kv_budget ------------------------------------------------------------------------------------


def test_kv_budget_article_910b3_host():
    # Article §3.4: 8 x 64 GB = 512 GB HBM, x 0.85 utilization x 0.6 KV share ~= 261 GB; DP2 -> ~130 GB.
    hbm_total = 8 * 64 * GiB
    host_exact = Fraction(hbm_total) * Fraction(85, 100) * Fraction(6, 10)
    budget = kv_budget("64GiB", 8, 0.85, 0.6, dp=2)
    assert budget == {
        "hbm_total_bytes": hbm_total,
        "host_bytes": int(host_exact),
        "per_dp_group_bytes": int(host_exact / 2),
    }
    assert 261 <= budget["host_bytes"] / GiB < 262
    assert 130 <= budget["per_dp_group_bytes"] / GiB < 131


def test_kv_budget_defaults_and_bounds():
    hbm = 64 * GiB
    one_group = kv_budget(hbm, 8, 1)  # utilization 1 and kv_share 0.6 by default, dp 1
    assert one_group["host_bytes"] == one_group["per_dp_group_bytes"] == int(Fraction(8 * hbm) * Fraction(3, 5))
    assert kv_budget(hbm, 8, 0.9, kv_share=1)["host_bytes"] == int(Fraction(8 * hbm) * Fraction(9, 10))
    a3 = kv_budget("64GiB", 16, 0.85, dp=4)  # A3 host: 16 NPUs
    assert a3["per_dp_group_bytes"] == int(Fraction(16 * hbm) * Fraction(51, 100) / 4)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": "0.85"}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
        ({"kv_share": 0}, "kv_share"),
        ({"kv_share": 1.5}, "kv_share"),
        ({"kv_share": None}, "kv_share"),
        ({"devices": 0}, "devices"),
        ({"devices": "8"}, "devices"),
        ({"devices": 8.0}, "devices"),
        ({"dp": 0}, "dp"),
        ({"dp": 3}, "dp"),  # 3 does not divide 8 devices
        ({"dp": True}, "dp"),
        ({"hbm_per_device": "lots"}, "hbm_per_device"),
        ({"hbm_per_device": "-64GiB"}, "hbm_per_device"),
        ({"hbm_per_device": 0}, "hbm_per_device"),
    ],
)
def test_kv_budget_refuses(kwargs, field):
    args = {"hbm_per_device": "64GiB", "devices": 8, "gpu_memory_utilization": 0.85, "kv_share": 0.6, "dp": 2}
    args.update(kwargs)
    with pytest.raises(PdError) as info:
        kv_budget(**args)
    assert (info.value.where, info.value.field) == ("pd_kv_budget", field)
    assert str(info.value).startswith(f"pd_kv_budget: {field}: ")


def test_kv_budget_twice_same_answer():
    assert kv_budget("64GiB", 8, 0.85, 0.6, 2) == kv_budget("64GiB", 8, 0.85, 0.6, 2)


# --- kv_tokens ------------------------------------------------------------------------------------


def test_kv_tokens_floor():
    assert kv_tokens("130GiB", 8) == 130 * GiB // 8
    assert kv_tokens(1000, 3.3) == int(Fraction(1000) / Fraction("3.3"))  # 303, not 303.03
    per_group = kv_budget("64GiB", 8, 0.85, 0.6, 2)["per_dp_group_bytes"]
    assert kv_tokens(per_group, 13727) == per_group // 13727


@pytest.mark.parametrize(
    "args, field",
    [
        (("130GiB", 0), "bytes_per_token"),
        (("130GiB", -8), "bytes_per_token"),
        (("130GiB", "8"), "bytes_per_token"),
        (("-1G", 8), "kv_bytes"),
        ((None, 8), "kv_bytes"),
    ],
)
def test_kv_tokens_refuses(args, field):
    with pytest.raises(PdError) as info:
        kv_tokens(*args)
    assert (info.value.where, info.value.field) == ("pd_kv_tokens", field)


def test_kv_tokens_twice_same_answer():
    assert kv_tokens(1000, 3.3) == kv_tokens(1000, 3.3)


# --- batched tokens: levels and recommendation ---------------------------------------------------


def test_article_safety_line_constants():
    assert (SWEET_SPOT, UPPER_BOUND, DANGER_ZONE) == (32 * 1024, 48 * 1024, 64 * 1024)


@pytest.mark.parametrize(
    "value, level",
    [
        (144, "ok"),
        (16384, "ok"),
        (SWEET_SPOT, "ok"),
        (SWEET_SPOT + 1, "upper"),
        (UPPER_BOUND, "upper"),
        (DANGER_ZONE - 1, "upper"),
        # the article: "65536 是危险区" -- 65536 itself is the danger zone, not its edge
        (DANGER_ZONE, "danger"),
        (DANGER_ZONE + 1, "danger"),
        (131072, "danger"),
    ],
)
def test_batched_tokens_level(value, level):
    assert batched_tokens_level(value) == level
    assert batched_tokens_level(value, tp=4) == batched_tokens_level(value, tp=4)


@pytest.mark.parametrize("args", [(0,), ("32768",), (True,), (32768.0,), (32768, 0), (32768, "4")])
def test_batched_tokens_level_refuses(args):
    with pytest.raises(PdError) as info:
        batched_tokens_level(*args)
    assert info.value.where == "pd_batched_tokens_level"


def _round_up(value, step):
    return (value + step - 1) // step * step


@pytest.mark.parametrize(
    "avg, low, high",
    [
        (1024, 16384, 16384),
        (4 * 1024, 16384, 16384),
        (6000, 16384, 24576),
        (8 * 1024, 16384, 24576),
        (10240, 32768, 32768),
        (16 * 1024, 32768, 32768),
        (20000, 49152, 65536),
        (28000, 49152, 65536),
        (32 * 1024, 49152, 65536),
    ],
)
def test_recommend_batched_tokens_table(avg, low, high):
    result = recommend_batched_tokens(avg)
    expected = min(high, max(low, _round_up(2 * avg, 8192)))
    assert result["recommended"] == expected
    assert (result["low"], result["high"]) == (low, high)
    assert result["recommended"] >= 2 * avg
    assert result["level"] == batched_tokens_level(expected)
    assert str(2 * avg) in result["rule"]


def test_recommend_batched_tokens_article_rows():
    # Article table: <= 4K -> 16384; 16K -> 32768; 32K -> 49152..65536.
    assert recommend_batched_tokens(4096)["recommended"] == 16384
    assert recommend_batched_tokens(16384)["recommended"] == 32768 == SWEET_SPOT
    assert recommend_batched_tokens(20000)["recommended"] == UPPER_BOUND
    assert recommend_batched_tokens(32768)["recommended"] == 2 * 32768 == DANGER_ZONE


def test_recommend_batched_tokens_beyond_table_is_error_level():
    avg = 40000
    result = recommend_batched_tokens(avg)
    assert result["level"] == "error"
    assert result["recommended"] == _round_up(2 * avg, 8192) >= 2 * avg
    assert str(DANGER_ZONE) in result["rule"]


def test_recommend_batched_tokens_other_tp_is_flagged():
    assert "TP8" in recommend_batched_tokens(16384, tp=8)["rule"]
    assert "TP4 table" in recommend_batched_tokens(16384)["rule"]
    assert "starting point" not in recommend_batched_tokens(16384)["rule"]


@given(st.integers(min_value=1, max_value=200_000))
def test_recommend_batched_tokens_never_below_two_prompts(avg):
    result = recommend_batched_tokens(avg)
    assert result["recommended"] >= 2 * avg
    assert result["low"] <= result["recommended"] <= result["high"]
    if avg <= 32768:
        # 2 x avg reaches the danger zone only at the table's last row (avg > 32768 - 4096)
        assert result["level"] in (("ok", "upper") if 2 * avg < DANGER_ZONE - 8192 else ("ok", "upper", "danger"))
    else:
        assert result["level"] == "error"


@pytest.mark.parametrize("args", [(0,), (-1,), ("4096",), (True,), (4096.0,), (4096, 0)])
def test_recommend_batched_tokens_refuses(args):
    with pytest.raises(PdError) as info:
        recommend_batched_tokens(*args)
    assert info.value.where == "pd_recommend_batched_tokens"


def test_recommend_batched_tokens_twice_same_answer():
    assert recommend_batched_tokens(28000) == recommend_batched_tokens(28000)


# --- expected_p_concurrency -----------------------------------------------------------------------


def test_p_concurrency_article_16k_prompt_at_8192_only_one_runs():
    # Article §4.2: max-num-seqs 32, DP2, a 16K prompt cannot fit 8192 -> only 1 running per group.
    seqs, dp, batched, avg = 32, 2, 8192, 16 * 1024
    result = expected_p_concurrency(seqs, dp, batched, avg)
    assert result["fit"] == batched // avg == 0
    assert result["concurrency_per_dp_group"] == 1
    assert result["concurrency"] == dp
    assert result["chunked"] is True
    assert result["level"] == "warning"
    assert result["limited_by"] == "max_num_batched_tokens"
    assert "only 1" in result["message"] and str(2 * avg) in result["message"]


def test_p_concurrency_article_16k_prompt_at_32768_two_run_per_dp_group():
    # Article §4.2 table: 16K prompts at 32768 -> "~2 per step"; §3.4: both limits are per DP group,
    # so a DP2 instance runs 2 per group and 4 in all (the old figure, 2, was one group's labelled
    # as the instance's).
    seqs, dp, batched, avg = 32, 2, 32768, 16 * 1024
    result = expected_p_concurrency(seqs, dp, batched, avg)
    assert result["concurrency_per_dp_group"] == min(seqs, batched // avg) == 2
    assert result["concurrency"] == 2 * dp == 4
    assert result["fit"] == 2
    assert result["seq_cap"] == seqs * dp == 64
    assert result["chunked"] is False
    assert result["level"] == "ok"


def test_p_concurrency_one_fit_is_warning_not_chunked():
    result = expected_p_concurrency(32, 2, 16384, 16384)
    assert (result["concurrency"], result["fit"], result["chunked"], result["level"]) == (2, 1, False, "warning")


def test_p_concurrency_limited_by_seqs():
    seqs, dp, batched, avg = 2, 2, 65536, 1024
    result = expected_p_concurrency(seqs, dp, batched, avg)
    assert result["concurrency"] == seqs * dp
    assert result["limited_by"] == "max_num_seqs"


@pytest.mark.parametrize(
    "args, field",
    [
        ((0, 2, 8192, 16384), "max_num_seqs"),
        ((32, 0, 8192, 16384), "dp"),
        ((32, 2, 0, 16384), "max_num_batched_tokens"),
        ((32, 2, 8192, 0), "avg_prompt_tokens"),
        (("32", 2, 8192, 16384), "max_num_seqs"),
        ((32, 2, 8192.0, 16384), "max_num_batched_tokens"),
    ],
)
def test_p_concurrency_refuses(args, field):
    with pytest.raises(PdError) as info:
        expected_p_concurrency(*args)
    assert (info.value.where, info.value.field) == ("pd_expected_p_concurrency", field)


def test_p_concurrency_twice_same_answer():
    assert expected_p_concurrency(32, 2, 32768, 16384) == expected_p_concurrency(32, 2, 32768, 16384)


# --- recommend_max_num_seqs -----------------------------------------------------------------------


def test_recommend_max_num_seqs_from_budget():
    per_group = kv_budget("64GiB", 8, 0.85, 0.6, 2)["per_dp_group_bytes"]
    tokens = kv_tokens(per_group, 13727)
    longest = 32768
    assert recommend_max_num_seqs(tokens, longest) == tokens // longest
    assert recommend_max_num_seqs(tokens, longest) >= capacity.START_MAX_NUM_SEQS


def test_recommend_max_num_seqs_at_least_one():
    assert recommend_max_num_seqs(100, 32768) == 1
    assert recommend_max_num_seqs(0, 32768) == 1


@pytest.mark.parametrize(
    "args, field",
    [
        ((1000, 0), "longest_prompt_tokens"),
        ((1000, "32768"), "longest_prompt_tokens"),
        ((-1, 32768), "kv_tokens_per_dp_group"),
        ((1000.5, 32768), "kv_tokens_per_dp_group"),
    ],
)
def test_recommend_max_num_seqs_refuses(args, field):
    with pytest.raises(PdError) as info:
        recommend_max_num_seqs(*args)
    assert (info.value.where, info.value.field) == ("pd_recommend_max_num_seqs", field)


def test_recommend_max_num_seqs_twice_same_answer():
    assert recommend_max_num_seqs(10_000_000, 32768) == recommend_max_num_seqs(10_000_000, 32768)


# --- retention_interval ---------------------------------------------------------------------------


@pytest.mark.parametrize("block", [32, 128, 16, 1])
def test_retention_interval(block):
    assert retention_interval(block) == 128 * block
    assert retention_interval(block) % block == 0


def test_retention_interval_article_values():
    assert retention_interval(32) == 32 * 128 == 4096
    assert retention_interval(128) == 128 * 128 == 16384


@pytest.mark.parametrize("bad", [0, -32, "32", True, 32.0, None])
def test_retention_interval_refuses(bad):
    with pytest.raises(PdError) as info:
        retention_interval(bad)
    assert (info.value.where, info.value.field) == ("pd_retention_interval", "block_size")


def test_retention_interval_twice_same_answer():
    assert retention_interval(32) == retention_interval(32)


# --- d_batched_tokens -----------------------------------------------------------------------------


def test_d_batched_tokens():
    seqs, spec = 48, 2
    assert d_batched_tokens(seqs, spec) == seqs * (1 + spec) == 144  # the article's D value
    assert d_batched_tokens(seqs) == seqs


@pytest.mark.parametrize(
    "args, field",
    [((0,), "max_num_seqs"), ((48, -1), "num_speculative_tokens"), ((48, "1"), "num_speculative_tokens")],
)
def test_d_batched_tokens_refuses(args, field):
    with pytest.raises(PdError) as info:
        d_batched_tokens(*args)
    assert (info.value.where, info.value.field) == ("pd_d_batched_tokens", field)


def test_d_batched_tokens_twice_same_answer():
    assert d_batched_tokens(48, 2) == d_batched_tokens(48, 2)


# --- weights per NPU, KV budget from the weights (issue 10 finding 5) -----------------------------
# Expected values are worked by hand from the published shapes (plugins/plugin_utils/data/models.yml's sources):
# 44 MoE layers (43 + MTP) x 256 experts x 3 x 4096 x 2048 routed-expert params, ~291.05e9 in all.

EXPERT_PARAMS = 44 * 256 * 3 * 4096 * 2048
DENSE_PARAMS = 291_050_000_000 - EXPERT_PARAMS
FAMILY = capacity.family_data("deepseek_v4_flash")


def test_weights_data_matches_the_published_totals():
    weights = FAMILY["weights"]
    assert weights["expert_params"] == EXPERT_PARAMS
    assert weights["dense_params"] == DENSE_PARAMS
    # 43 main layers' experts + the dense part = the model card's 284.44B (MTP not counted there)
    assert abs(43 * 256 * 3 * 4096 * 2048 + DENSE_PARAMS - 284.44e9 - 0.17e9) < 0.05e9
    assert "source" in weights and "source" in FAMILY["runtime_reserve"]


def test_weights_per_npu_w8a8_dp2_tp4_expert_parallel():
    w = capacity.weights_per_npu(FAMILY["weights"], "w8a8", tp=4, dp=2, expert_parallel=True)
    assert w["ep_size"] == 8 and w["experts_per_npu"] == 32
    assert w["expert_bytes"] == EXPERT_PARAMS // 8          # 1 byte per param, 1/8 of the experts
    assert w["dense_bytes"] == -(-DENSE_PARAMS * 2 // 4)    # bf16 over TP4
    assert 36 * GiB < w["total_bytes"] < 37 * GiB


def test_weights_per_npu_without_expert_parallel_shard_experts_over_tp_only():
    w = capacity.weights_per_npu(FAMILY["weights"], "w8a8", tp=4, dp=2, expert_parallel=False)
    assert w["ep_size"] == 1 and w["experts_per_npu"] is None
    assert w["expert_bytes"] == EXPERT_PARAMS // 4


def test_weights_per_npu_uneven_expert_split_rounds_up():
    # EP12: 256 / 12 = 21.33 -> the fullest rank holds 22 experts
    w = capacity.weights_per_npu(FAMILY["weights"], "bf16", tp=4, dp=3, expert_parallel=True)
    assert w["experts_per_npu"] == 22
    assert w["expert_bytes"] == -(-EXPERT_PARAMS * 2 * 22 // 256)


@pytest.mark.parametrize("quant, bits", [("bf16", 16), ("w8a8", 8), ("w4a8", 4)])
def test_weights_per_npu_scales_with_the_quantization(quant, bits):
    w = capacity.weights_per_npu(FAMILY["weights"], quant, tp=8, dp=1)
    assert w["expert_bytes"] == -(-EXPERT_PARAMS * bits // 64)


def test_weights_per_npu_refuses_an_unknown_quantization():
    with pytest.raises(PdError) as info:
        capacity.weights_per_npu(FAMILY["weights"], "fp8", tp=4)
    assert info.value.field == "quantization" and "w8a8" in info.value.problem


def test_kv_budget_article_cluster_is_far_below_the_0_6_share():
    """The article's P (910B3 64 GB, DP2 x TP4, 0.85, 32768 batched tokens) with w8a8 weights.

    The device exposes 60.96 of its 64 GiB and vLLM's budget is 0.85 of that; the reserve is the
    1.01 GiB of non-torch + graph memory of vllm-ascend issue 13439's log + 128 KiB per batched token.
    """
    b = capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, tp=4, dp=2, max_num_batched_tokens=32768)
    weights = EXPERT_PARAMS // 8 + -(-DENSE_PARAMS * 2 // 4)
    reserve = round(1.01 * GiB) + 32768 * 128 * 1024
    exposed = 64 * GiB - round(3.04 * GiB)
    per_npu = int(exposed * 0.85) - weights - reserve
    assert b["fits"] is True and b["estimate"] is True
    assert b["kv_per_npu_bytes"] == per_npu
    assert b["kv_per_dp_group_bytes"] == per_npu * 4
    assert b["kv_per_instance_bytes"] == per_npu * 8
    article_share = kv_budget("64GiB", 8, 0.85, 0.6, dp=2)["host_bytes"]
    assert b["kv_per_instance_bytes"] < article_share / 2


def test_kv_budget_decode_keeps_more_than_prefill():
    """A small batched-token budget (D's 144) leaves the activation reserve nearly empty."""
    p = capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, 4, 2, 32768)
    d = capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, 4, 2, 144)
    assert d["kv_per_npu_bytes"] - p["kv_per_npu_bytes"] == (32768 - 144) * 128 * 1024


@pytest.mark.parametrize("quant, hbm, tp, dp", [
    ("bf16", "64GiB", 1, 1),    # 582 GB of weights on one NPU
    ("bf16", "64GiB", 4, 2),    # experts alone 70.9 GB per NPU over EP8
    ("w8a8", "32GiB", 4, 2),    # a 910B4 (32 GB): 36.5 GiB of weights > 27.2 GiB usable
    ("w8a8", "64GiB", 4, 1),    # EP4: 70.9 GB of experts per NPU
])
def test_weights_that_do_not_fit_leave_no_kv(quant, hbm, tp, dp):
    b = capacity.role_kv_budget(FAMILY, quant, hbm, 0.85, tp, dp, 8192)
    assert b["fits"] is False
    assert b["kv_per_npu_bytes"] == 0 and b["shortfall_bytes"] > 0


def test_upstream_single_node_recipe_fits():
    """vllm-ascend's tutorial: w8a8-mtp fits one A2 (64GB x 8) at TP8, EP, 0.9, 8192 batched tokens."""
    b = capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.9, tp=8, dp=1, max_num_batched_tokens=8192)
    assert b["fits"] is True


def test_a3_host_sixteen_npus_spread_experts_further():
    """A3: 16 NPUs of 64 GB; an instance of DP4 x TP4 has EP16 = 16 experts per NPU."""
    b = capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, tp=4, dp=4, max_num_batched_tokens=144)
    assert b["weights"]["experts_per_npu"] == 16
    assert b["weights"]["expert_bytes"] == EXPERT_PARAMS // 16
    assert b["kv_per_instance_bytes"] == b["kv_per_npu_bytes"] * 16


def test_role_kv_budget_twice_same_answer():
    assert capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, 4, 2, 32768) == \
        capacity.role_kv_budget(FAMILY, "w8a8", "64GiB", 0.85, 4, 2, 32768)


def test_ram_guidance_reproduces_the_article_and_generalises_additively():
    assert capacity.ram_guidance("200GiB") == 512 * GiB       # article: 200 GB offload -> >= 512 GB
    assert capacity.ram_guidance("100GiB") == 412 * GiB       # offload + 312 GiB of system + vLLM base
    assert capacity.ram_guidance(0) == 0


# --- KV bytes per token from the Ascend cache layout; the A2 start-up log of issue 13439 (issue 19 #3) --

def test_kv_bytes_per_token_derived_from_the_ascend_layout():
    """Worked by hand from vllm-ascend main's layout (models.yml kv_cache_layout sources): ratio-4 layers
    keep a bf16 512-wide attention entry (1024 B) + an int8 128-wide indexer entry with one fp16 scale
    (130 B) per 4 tokens, ratio-128 layers a 1024 B entry per 128 tokens; 21 and 20 such layers."""
    for family in ("a2", "a3"):
        got = capacity.kv_bytes_per_token(FAMILY["kv_cache_layout"], family)
        assert got["attention_entry_bytes"] == 512 * 2
        assert got["indexer_entry_bytes"] == 128 * 1 + 1 * 2
        assert got["by_ratio"] == {0: 0, 4: 21 * 1154 / 4, 128: 20 * 1024 / 128}
        assert got["bytes_per_token"] == 6218.5
    # the planning estimate is that derivation, rounded up, and lies inside the judging band
    assert FAMILY["estimate"]["marginal_bytes_per_token"] == 6219
    band = FAMILY["bytes_per_token"]
    assert band["min"] <= 6218.5 <= band["max"]
    # the CUDA fp8 figure the estimate used before is ~1.9x smaller: it overstated tokens that much
    assert 1.85 < 6218.5 / 3300 < 1.9


def test_kv_bytes_per_token_refuses_an_unknown_device_family():
    with pytest.raises(PdError) as info:
        capacity.kv_bytes_per_token(FAMILY["kv_cache_layout"], "h100")
    assert info.value.field == "device_family" and "a2" in info.value.problem


def _startup_fixture():
    import os
    import yaml
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "fixtures", "upstream", "startup-logs",
                        "issue-13439-a2.yml")
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_capacity_model_reproduces_the_published_a2_startup():
    """vllm-ascend issue 13439 (A2 910B2 64 GB, w8a8 + MTP, DP8 x TP1 with EP8, utilization 0.9).

    Tolerances: requested budget within 0.01 GiB (the log's rounding); weights within 1% of 47.4 GiB;
    fixed reserve = non-torch + graphs within 0.01 GiB; and the KV per NPU between the engine's two
    figures, 6.1 GiB (what fits inside the requested memory once graphs are captured) and 7.03 GiB
    (what it allocated before capturing them), for any batch from 1 to 2048 tokens (activation 0 to
    0.25 GiB, bracketing the log's 0.21 GiB peak, whose batch the log does not give).
    """
    fx = _startup_fixture()
    mem, dep = fx["memory_gib"], fx["deployment"]
    assert fx["source"]["issue"] == 13439 and fx["source"]["url"].endswith("/13439")
    hbm = f"{fx['hardware']['hbm_nominal_mb']}MiB"
    for tokens in (1, 256, 2048):
        b = capacity.role_kv_budget(FAMILY, "w8a8", hbm, dep["gpu_memory_utilization"], tp=dep["tp"],
                                    dp=dep["dp"], max_num_batched_tokens=tokens,
                                    expert_parallel=dep["expert_parallel"])
        assert abs(b["exposed_per_npu_bytes"] / GiB - mem["device_total"]) < 0.01
        assert abs(b["usable_per_npu_bytes"] / GiB - mem["requested"]) < 0.01
        assert abs(b["weights"]["total_bytes"] / GiB - mem["weights"]) / mem["weights"] < 0.01
        assert abs(b["reserve"]["fixed_bytes"] / GiB - (mem["non_torch"] + mem["graphs"])) < 0.01
        kv = b["kv_per_npu_bytes"] / GiB
        assert mem["kv_cache_to_fit_requested"] <= kv <= mem["kv_cache"], (tokens, kv)
