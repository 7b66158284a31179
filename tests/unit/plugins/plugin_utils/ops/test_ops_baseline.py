"""plugin_utils.ops.baseline: bare-engine specs and their start-up logs fitted back to a KV footprint.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import logparse
from ansible_collections.pd.deploy.plugins.plugin_utils.ops import baseline, common
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.ops_inputs import CLUSTER, FIXED, GIB, LENGTHS, MARGINAL, P99, PLAN, plan_of, vllm_log


def test_baseline_spec_drops_the_connectors_and_swaps_max_model_len():
    raw = copy.deepcopy(CLUSTER)
    raw["decode"].update({"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                          "recompute_scheduler": True})
    spec = plan_of(raw)["hosts"]["c1-d0"]["specs"][0]
    assert "--kv-transfer-config" in spec["command"] and "--additional-config" in spec["command"]
    bare = baseline.baseline_spec(spec, 16384)
    assert bare["name"] == spec["name"] + "-baseline"
    assert "--kv-transfer-config" not in bare["command"] and "--additional-config" not in bare["command"]
    i = bare["command"].index("--max-model-len")
    assert bare["command"][i + 1] == "16384" and bare["command"].count("--max-model-len") == 1
    assert "--no-disable-hybrid-kv-cache-manager" in bare["command"]
    kept = list(spec["command"])
    for flag in ("--kv-transfer-config", "--additional-config"):
        k = kept.index(flag)
        del kept[k:k + 2]
    j = kept.index("--max-model-len")
    del kept[j:j + 2]
    assert sorted(a for a in bare["command"] if a not in ("--max-model-len", "16384")) == sorted(kept)
    assert (bare["devices"], bare["image"], bare["env"]) == (spec["devices"], spec["image"], spec["env"])
    assert bare["restart_policy"] == "no" and bare["pinned_offload_bytes"] == 0
    assert bare["labels"]["pd.baseline"] == "true" and bare["labels"]["pd.managed-by"] == "pd-deploy"
    assert spec["name"].endswith("dp0") and "pd.spec-hash" in spec["labels"], "the input spec is not changed"
    with pytest.raises(PdError):
        baseline.baseline_spec(PLAN["clusters"]["c1"]["proxy"], 16384)


def test_two_boots_are_fitted_back_to_the_footprint_that_made_them():
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL), "name": "r0", "role": "decode"}
             for L in LENGTHS]
    report = baseline.baseline_report(boots, config=CLUSTER)
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
    band = common.model_band("deepseek_v4_flash")
    marginal = 10 * band["max"]
    boots = [{"max_model_len": L, "log_text": vllm_log(L, 0, marginal, available_gib=60)} for L in LENGTHS]
    report = baseline.baseline_report(boots)
    fit = report["fits"]["all"]["fit"]
    assert fit["marginal_bytes_per_token"] == pytest.approx(marginal, rel=0.01)
    assert report["verdict"]["verdict"] == "far_high"
    assert "hybrid" in report["verdict"]["message"] and "hybrid" in report["verdict"]["likely_cause"]
    md = baseline.baseline_markdown(report, "c1", {"vllm_ascend_version": "0.25.1"})
    assert "far_high" in md and "- vllm_ascend_version: 0.25.1" in md


def test_a_band_override_changes_the_judgement():
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, 12000)} for L in LENGTHS]
    assert baseline.baseline_report(boots)["verdict"]["verdict"] == "high"
    bf16 = {"min": 4096, "max": 16384, "source": "bf16 KV cache, our own two-point fit"}
    assert baseline.baseline_report(boots, band=bf16)["verdict"]["verdict"] == "ok"


def test_one_length_only_gives_no_fit_and_a_hint_verdict():
    report = baseline.baseline_report([{"max_model_len": 32768, "log_text": vllm_log(32768, FIXED, MARGINAL)}])
    assert report["fits"]["all"]["fit"] is None
    assert "second length" in report["fits"]["all"]["note"]
    assert "single ratio" in report["verdict"]["basis"]


def test_a_boot_whose_log_is_of_another_length_is_refused():
    with pytest.raises(PdError) as info:
        baseline.baseline_report([{"max_model_len": 16384, "log_text": vllm_log(32768, FIXED, MARGINAL)}])
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
    assert containers.docker_log_text(body) == log
    # text as Ansible hands it over: undecodable header bytes surrogate-escaped
    assert containers.docker_log_text(body.decode("utf-8", "surrogateescape")) == log
    assert containers.docker_log_text(log.encode()) == log                   # a TTY container: raw stream
    spec = PLAN["hosts"]["c1-d0"]["specs"][0]
    slurped = [{"item": {"item": spec, "status": 200}, "content": base64.b64encode(body).decode(), "encoding": "base64"}]
    assert containers.docker_logs(slurped) == {spec["name"]: log}


def test_baseline_boots_from_the_bare_engines_logs():
    rank = PLAN["hosts"]["c1-d0"]["specs"][0]
    bare = baseline.baseline_spec(rank, 16384)
    boots = baseline.baseline_boots([bare], {bare["name"]: vllm_log(16384, FIXED, MARGINAL)}, 16384)
    assert boots[0]["name"] == rank["name"] and boots[0]["role"] == "decode"
    assert logparse.parse_startup_log(boots[0]["log_text"])["concurrency_len"] == 16384
    with pytest.raises(PdError) as info:
        baseline.baseline_boots([bare], {}, 16384)
    assert info.value.field == bare["name"]
    message = baseline.baseline_failure([bare], {bare["name"]: "ValueError: To serve at least one request"}, "h1")
    assert "h1: 1 bare engine(s) never became healthy" in message and "ValueError" in message
