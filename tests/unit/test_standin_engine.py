"""The stand-in `vllm serve` (tests/fixtures/images/vllm_ascend_standin/vllm_standin.py):
strict flags, vllm-ascend start-up rules, the KV start-up lines and their footprint
model, the HTTP routes, /metrics, and the fault switches. Runs the script as a
subprocess on 127.0.0.1; no Docker."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.standin_procs import HOST, clean_env, free_port, http, http_json, run_engine

GIB = 1024**3
MB_CONSUMER = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
                          "engine_id": "1", "kv_port": "30100"})
MB_PRODUCER = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer",
                          "engine_id": "0", "kv_port": "30000"})
KV_BOTH = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both"})
RECOMPUTE_NESTED = json.dumps({"scheduler_config": {"recompute_scheduler_enable": True}})
RECOMPUTE_TOP = json.dumps({"recompute_scheduler_enable": True})


def kv_lines(text: str) -> dict:
    """The three start-up figures, each line parsed as an operator's script would."""
    avail = re.findall(r"Available KV cache memory: ([\d.]+) GiB", text)
    tokens = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
    conc = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    return {
        "available": [float(a) for a in avail],
        "tokens": [int(t.replace(",", "")) for t in tokens],
        "max_model_len": [int(c[0].replace(",", "")) for c in conc],
        "concurrency": [float(c[1]) for c in conc],
    }


# --------------------------------------------------------------------------- flags
class TestStrictFlags:
    def test_unknown_flag_exits_2_like_vllm(self):
        r = run_engine(["serve", "/m", "--max-model-len", "1024", "--no-such-flag", "3"])
        assert r.returncode == 2
        assert "vllm: error: unrecognized arguments: --no-such-flag 3" in r.stderr

    def test_abbreviated_flag_is_refused(self):
        r = run_engine(["serve", "/m", "--max-model", "1024"])
        assert r.returncode == 2
        assert "unrecognized arguments: --max-model" in r.stderr

    def test_missing_value_and_wrong_type_exit_2(self):
        assert run_engine(["serve", "/m", "--max-model-len"]).returncode == 2
        r = run_engine(["serve", "/m", "--max-num-seqs", "many"])
        assert r.returncode == 2
        assert "invalid int value: 'many'" in r.stderr

    @pytest.mark.parametrize("flag", ["--kv-transfer-config", "--additional-config", "--speculative-config"])
    def test_json_flags_must_parse(self, flag):
        r = run_engine(["serve", "/m", flag, "{'single': 'quotes'}"])
        assert r.returncode == 2
        assert f"argument {flag}: not valid JSON" in r.stderr

    def test_every_flag_the_brief_lists_is_accepted(self, servers):
        srv = servers.engine(
            "--served-model-name", "dsv4", "--data-parallel-size", "2", "--data-parallel-rank", "1",
            "--data-parallel-address", HOST, "--data-parallel-rpc-port", "13399",
            "--data-parallel-size-local", "1", "--tensor-parallel-size", "4", "--max-model-len", "32768",
            "--max-num-seqs", "32", "--max-num-batched-tokens", "32768", "--gpu-memory-utilization", "0.85",
            "--block-size", "128", "--enable-prefix-caching", "--no-enable-prefix-caching",
            "--no-disable-hybrid-kv-cache-manager", "--max-num-partial-prefills", "1",
            "--max-long-partial-prefills", "1", "--long-prefill-token-threshold", "8192", "--enforce-eager",
            "--trust-remote-code", "--kv-transfer-config", MB_CONSUMER, "--additional-config", "{}",
            "--seed", "1024", "--quantization", "ascend", "--speculative-config",
            '{"num_speculative_tokens": 1, "method": "deepseek_mtp"}', "--enable-chunked-prefill")
        assert "non-default args" in srv.output()

    def test_the_deepseek_v4_flash_recipe_flags_are_accepted_on_main(self, servers):
        """The decode argv of vllm-ascend main's nightly DeepSeek-V4-Flash PD config
        (tests/e2e/nightly/multi_node/external_dp/config/DeepSeek-V4-flash-w8a8-PD-prefix.yaml),
        every flag name present in vLLM 0.27.1 (engine/arg_utils.py, entrypoints/openai/cli_args.py),
        plus --api-key (FrontendArgs.api_key)."""
        ktc = json.dumps({"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer",
                          "kv_port": "30100", "engine_id": "1", "kv_connector_extra_config": {
                              "prefill": {"dp_size": 4, "tp_size": 4}, "decode": {"dp_size": 16, "tp_size": 1}}})
        srv = servers.engine(
            "--data-parallel-size", "16", "--data-parallel-rank", "3", "--data-parallel-address", HOST,
            "--data-parallel-rpc-port", "13399", "--tensor-parallel-size", "1", "--enable-expert-parallel",
            "--seed", "1024", "--max-model-len", "8192", "--max-num-batched-tokens", "240",
            "--max-num-seqs", "60", "--async-scheduling", "--block-size", "32", "--no-enable-prefix-caching",
            "--no-disable-hybrid-kv-cache-manager", "--model-loader-extra-config",
            '{"enable_multithread_load": true, "num_threads": 128}', "--trust-remote-code",
            "--tokenizer-mode", "deepseek_v4", "--tool-call-parser", "deepseek_v4", "--enable-auto-tool-choice",
            "--reasoning-parser", "deepseek_v4", "--gpu-memory-utilization", "0.95", "--quantization", "ascend",
            "--speculative-config", '{"num_speculative_tokens": 3,"method": "mtp"}',
            "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}', "--kv-transfer-config", ktc,
            "--additional-config", '{"enable_cpu_binding":true,"recompute_scheduler_enable":true}',
            "--api-key", "k1", env=clean_env(PD_STANDIN_ASCEND_VERSION="main"))
        out = srv.output()
        assert "non-default args" in out and "Recompute scheduler enabled" in out

    @pytest.mark.parametrize("flag", ["--model-loader-extra-config", "--compilation-config"])
    def test_more_json_flags_must_parse(self, flag):
        r = run_engine(["serve", "/m", flag, "{not json"])
        assert r.returncode == 2 and f"argument {flag}" in r.stderr and "not valid JSON" in r.stderr

    def test_underscore_spelling_is_accepted_like_vllm(self, servers):
        srv = servers.engine("--max_model_len=4096")
        assert kv_lines(srv.output())["max_model_len"] == [4096]

    def test_argv_and_env_are_printed_for_docker_logs(self, servers):
        srv = servers.engine("--max-model-len", "2048",
                             env=clean_env(ASCEND_RT_VISIBLE_DEVICES="0,1,2,3", HCCL_BUFFSIZE="1024"))
        out = srv.output()
        assert '"--max-model-len", "2048"' in out
        assert '"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"' in out
        assert '"HCCL_BUFFSIZE": "1024"' in out


# --------------------------------------------------------------------------- rules
class TestAscendRules:
    # vllm_ascend/platform.py (v0.23.0 .. main): refused unless kv_consumer, but on a
    # kv_producer only ignored with a WARNING.
    def test_recompute_on_a_kv_both_engine_refuses_to_start(self):
        r = run_engine(["serve", "/m", "--kv-transfer-config", KV_BOTH, "--additional-config", RECOMPUTE_NESTED])
        assert r.returncode == 1
        assert "recompute_scheduler_enable can only be enabled on PD-disaggregated D nodes" in r.stderr
        assert "kv_role='kv_both'" in r.stderr

    def test_recompute_without_any_connector_refuses_to_start(self):
        r = run_engine(["serve", "/m", "--additional-config", RECOMPUTE_TOP])
        assert r.returncode == 1
        assert "kv_role=None" in r.stderr

    def test_recompute_on_a_producer_is_ignored_with_a_warning(self, servers):
        srv = servers.engine("--kv-transfer-config", MB_PRODUCER, "--additional-config", RECOMPUTE_NESTED,
                             env=clean_env(PD_STANDIN_PREEMPT_EVERY="1"))
        out = srv.output()
        assert re.search(r"WARNING .*recompute_scheduler_enable is ignored on PD-disaggregated P nodes", out)
        assert "Recompute scheduler enabled" not in out
        http_json("POST", srv.url + "/v1/completions", {"prompt": "p", "max_tokens": 1})
        assert "[RecomputeScheduler]" not in srv.output()  # the scheduler really is off

    def test_recompute_on_a_consumer_starts_and_says_so(self, servers):
        srv = servers.engine("--kv-transfer-config", MB_CONSUMER, "--additional-config", RECOMPUTE_NESTED)
        assert "Recompute scheduler enabled (recompute_scheduler_enable at scheduler_config)" in srv.output()

    def test_v023_reads_only_the_top_level_key(self, servers):
        v023 = clean_env(PD_STANDIN_ASCEND_VERSION="0.23.0")
        # nested form silently ignored: no refusal on kv_both, no recompute on a consumer
        srv = servers.engine("--kv-transfer-config", KV_BOTH, "--additional-config", RECOMPUTE_NESTED, env=v023)
        assert "Recompute scheduler enabled" not in srv.output()
        srv = servers.engine("--kv-transfer-config", MB_CONSUMER, "--additional-config", RECOMPUTE_NESTED, env=v023)
        assert "Recompute scheduler enabled" not in srv.output()
        r = run_engine(["serve", "/m", "--kv-transfer-config", KV_BOTH, "--additional-config", RECOMPUTE_TOP],
                       env=v023)
        assert r.returncode == 1

    def test_top_level_key_still_works_later_but_is_deprecated(self, servers):
        srv = servers.engine("--kv-transfer-config", MB_CONSUMER, "--additional-config", RECOMPUTE_TOP)
        assert "recompute_scheduler_enable at top level (deprecated)" in srv.output()

    def test_recompute_offload_connector_needs_kv_consumer(self):
        multi = {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
            "connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_both"},
                           {"kv_connector": "RecomputeCPUOffloadConnector", "kv_role": "kv_both"}]}}
        r = run_engine(["serve", "/m", "--kv-transfer-config", json.dumps(multi)])
        assert r.returncode == 1
        assert "RecomputeCPUOffloadConnector requires kv_role 'kv_consumer'" in r.stderr

    def test_unknown_kv_role_is_refused(self):
        r = run_engine(["serve", "/m", "--kv-transfer-config", '{"kv_connector": "X", "kv_role": "producer"}'])
        assert r.returncode == 1
        assert "Unsupported kv_role" in r.stderr

    # vLLM's EngineArgs raises NotImplementedError for concurrent partial prefill on the
    # releases that have the flags (plugins/plugin_utils/data/versions.yml partial_prefills_over_max).
    @pytest.mark.parametrize("flag", ["--max-num-partial-prefills", "--max-long-partial-prefills"])
    def test_partial_prefills_above_one_are_refused(self, flag):
        r = run_engine(["serve", "/m", flag, "2"])
        assert r.returncode == 1
        assert "NotImplementedError: Concurrent Partial Prefill is not supported" in r.stderr

    def test_partial_prefills_of_one_start(self, servers):
        servers.engine("--max-num-partial-prefills", "1", "--max-long-partial-prefills", "1")

    @pytest.mark.parametrize("flag", ["--max-num-partial-prefills", "--max-long-partial-prefills",
                                      "--disable-log-requests"])
    def test_flags_vllm_0_27_1_dropped_are_unknown_on_main(self, flag):
        """vLLM 0.27.1 (the vLLM of vllm-ascend main) has none of these in EngineArgs."""
        args = ["serve", "/m", flag] + ([] if flag == "--disable-log-requests" else ["1"])
        r = run_engine(args, env=clean_env(PD_STANDIN_ASCEND_VERSION="main"))
        assert r.returncode == 2
        assert f"unrecognized arguments: {flag}" in r.stderr

    def test_auto_tool_choice_needs_a_parser(self):
        """vllm/entrypoints/openai/cli_args.py validate_parsed_serve_args (vLLM 0.27.1)."""
        r = run_engine(["serve", "/m", "--enable-auto-tool-choice"])
        assert r.returncode == 1
        assert "--enable-auto-tool-choice requires --tool-call-parser" in r.stderr

    @pytest.mark.parametrize("gmu", ["0", "1.2"])
    def test_gpu_memory_utilization_out_of_range(self, gmu):
        r = run_engine(["serve", "/m", "--gpu-memory-utilization", gmu])
        assert r.returncode == 1
        assert "GPU memory utilization must be within (0, 1]" in r.stderr

    def test_dp_rank_must_be_below_dp_size(self):
        r = run_engine(["serve", "/m", "--data-parallel-size", "2", "--data-parallel-rank", "2"])
        assert r.returncode == 1
        assert "data_parallel_rank (2)" in r.stderr


class TestDeviceCheck:
    def test_no_npu_devices_means_no_start(self, tmp_path):
        r = run_engine(["serve", "/m"], env=clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=tmp_path))
        assert r.returncode == 1
        assert "davinci_manager" in r.stderr and "version.info" in r.stderr

    def test_fewer_npus_than_tp(self, tmp_path):
        root = fake_tree(tmp_path, npus=2)
        r = run_engine(["serve", "/m", "-tp", "4"], env=clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root))
        assert r.returncode == 1
        assert "tensor_parallel_size=4 needs 4 NPUs but the container has 2 usable" in r.stderr

    def test_enough_npus_start(self, tmp_path, servers):
        root = fake_tree(tmp_path, npus=4)
        servers.engine("-tp", "4", env=clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root))

    # Inside a container the NPUs it was given are numbered from 0 (DOMAIN.md section 2): a
    # rank given host NPUs 4-7 only sees 4 devices, so ASCEND_RT_VISIBLE_DEVICES=4,5,6,7 is
    # out of range (the CANN runtime: "set ASCEND_RT_VISIBLE_DEVICES:4 error, input data rang[0-4)").
    def test_host_ids_in_a_container_that_sees_fewer_npus_are_refused(self, tmp_path):
        root = fake_tree(tmp_path, npus=4)
        env = clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root, ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
        r = run_engine(["serve", "/m", "-tp", "4"], env=env)
        assert r.returncode == 1
        assert "set ASCEND_RT_VISIBLE_DEVICES:4 error, input data rang[0-4)" in r.stderr

    def test_one_id_out_of_range_is_enough_to_fail(self, tmp_path):
        root = fake_tree(tmp_path, npus=2)
        env = clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root, ASCEND_RT_VISIBLE_DEVICES="1,2")
        r = run_engine(["serve", "/m", "-tp", "2"], env=env)
        assert r.returncode == 1
        assert "set ASCEND_RT_VISIBLE_DEVICES:2 error, input data rang[0-2)" in r.stderr

    def test_physical_ids_start_when_the_container_has_all_host_npus(self, tmp_path, servers):
        root = fake_tree(tmp_path, npus=8)
        env = clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root, ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
        servers.engine("-tp", "4", env=env)

    def test_container_local_ids_start(self, tmp_path, servers):
        root = fake_tree(tmp_path, npus=2)
        env = clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root, ASCEND_RT_VISIBLE_DEVICES="0,1")
        servers.engine("-tp", "2", env=env)

    def test_fewer_visible_ids_than_tp(self, tmp_path):
        root = fake_tree(tmp_path, npus=8)
        env = clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root, ASCEND_RT_VISIBLE_DEVICES="0,1")
        r = run_engine(["serve", "/m", "-tp", "4"], env=env)
        assert r.returncode == 1 and "needs 4 NPUs but the container has 2 usable" in r.stderr


def fake_tree(tmp_path, npus):
    """Regular files stand for the device nodes: the check only looks at names."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for name in [f"davinci{i}" for i in range(npus)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]:
        (root / "dev" / name).touch()
    (root / "usr/local/Ascend/driver/lib64").mkdir(parents=True)
    (root / "usr/local/Ascend/driver/version.info").write_text("Version=24.1.rc3\n")
    return root


# --------------------------------------------------------------------------- KV lines
class TestKvStartupLines:
    def test_one_set_of_lines_per_tp_worker(self, servers):
        out = servers.engine("-tp", "4", "--max-model-len", "32768").output()
        kv = kv_lines(out)
        assert kv["available"] == [20.0] * 4
        assert len(kv["tokens"]) == 4 and len(set(kv["tokens"])) == 1
        assert re.search(r"\(Worker_DP0_TP3 pid=\d+\) INFO .* Available KV cache memory", out)
        assert re.search(r"\(EngineCore_DP0 pid=\d+\) INFO .* GPU KV cache size: [\d,]+ tokens", out)

    def test_default_footprint_numbers(self, servers):
        kv = kv_lines(servers.engine("--max-model-len", "32768").output())
        per_request = 200 * 1024**2 + 3300 * 32768
        concurrency = 20 * GIB / per_request
        assert kv["concurrency"] == [round(concurrency, 2)]
        assert kv["tokens"] == [int(concurrency * 32768)]
        bytes_per_token = kv["available"][0] * GIB / kv["tokens"][0]  # the article's formula
        assert 9_000 < bytes_per_token < 10_500

    def test_env_sets_the_footprint(self, servers):
        env = clean_env(PD_STANDIN_KV_GIB="10", PD_STANDIN_MARGINAL_BYTES="1000", PD_STANDIN_FIXED_BYTES="0")
        kv = kv_lines(servers.engine("--max-model-len", "1000", env=env).output())
        assert kv["available"] == [10.0]
        assert kv["tokens"] == [int(10 * GIB / 1000)]

    def test_two_boots_recover_marginal_and_fixed_bytes(self, servers):
        """DOMAIN.md section 5: per-request footprint = available / concurrency; two
        max-model-len values give a line whose slope is the marginal bytes per token
        and whose intercept is the fixed bytes per request."""
        points = []
        for length in (8192, 65536):
            kv = kv_lines(servers.engine("--max-model-len", str(length)).output())
            available = kv["available"][0] * GIB
            points.append((length, available * length / kv["tokens"][0]))
        (l1, f1), (l2, f2) = points
        slope = (f2 - f1) / (l2 - l1)
        intercept = f1 - slope * l1
        assert slope == pytest.approx(3300, rel=0.01)
        assert intercept == pytest.approx(200 * 1024**2, rel=0.01)

    def test_disabled_hybrid_manager_multiplies_marginal_bytes(self, servers):
        on = kv_lines(servers.engine("--max-model-len", "32768").output())["tokens"][0]
        off = kv_lines(servers.engine("--max-model-len", "32768", "--disable-hybrid-kv-cache-manager")
                       .output())["tokens"][0]
        per_request_off = 200 * 1024**2 + 33000 * 32768
        assert off == int(20 * GIB / per_request_off * 32768)
        assert on / off > 3

    def test_connector_without_no_disable_flag_disables_hybrid_manager(self, servers):
        auto = servers.engine("--max-model-len", "32768", "--kv-transfer-config", MB_CONSUMER)
        kept = servers.engine("--max-model-len", "32768", "--kv-transfer-config", MB_CONSUMER,
                              "--no-disable-hybrid-kv-cache-manager")
        assert "Hybrid KV cache manager is disabled" in auto.output()
        assert kv_lines(auto.output())["tokens"][0] < kv_lines(kept.output())["tokens"][0]

    def test_model_len_defaults_to_config_json(self, servers, tmp_path):
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text('{"max_position_embeddings": 163840}')
        kv = kv_lines(servers.engine(model=str(model)).output())
        assert kv["max_model_len"] == [163840]

    def test_not_even_one_request_fits(self):
        r = run_engine(["serve", "/m", "--max-model-len", "1000000"], env=clean_env(PD_STANDIN_KV_GIB="1"))
        assert r.returncode == 1
        assert "estimated maximum model length is" in r.stderr


# --------------------------------------------------------------------------- HTTP
class TestRoutes:
    @pytest.fixture
    def engine(self, servers):
        return servers.engine("--served-model-name", "dsv4", "--max-model-len", "4096",
                              "--kv-transfer-config", MB_CONSUMER, "--no-disable-hybrid-kv-cache-manager")

    def test_health_and_models(self, engine):
        assert http("GET", engine.url + "/health")[0] == 200
        status, models = http_json("GET", engine.url + "/v1/models")
        assert status == 200
        assert [m["id"] for m in models["data"]] == ["dsv4"]
        assert models["data"][0]["max_model_len"] == 4096

    def test_completion_is_deterministic_and_honours_max_tokens(self, engine):
        body = {"model": "dsv4", "prompt": "The capital of France is", "max_tokens": 7}
        s1, r1 = http_json("POST", engine.url + "/v1/completions", body)
        s2, r2 = http_json("POST", engine.url + "/v1/completions", body)
        assert s1 == s2 == 200
        assert r1["choices"][0]["text"] == r2["choices"][0]["text"]
        assert len(r1["choices"][0]["text"].split()) == 7
        assert r1["usage"]["completion_tokens"] == 7
        other = http_json("POST", engine.url + "/v1/completions", {**body, "prompt": "Something else"})[1]
        assert other["choices"][0]["text"] != r1["choices"][0]["text"]

    def test_chat_completion(self, engine):
        status, r = http_json("POST", engine.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert status == 200
        assert r["object"] == "chat.completion"
        assert len(r["choices"][0]["message"]["content"].split()) == 3

    def test_stream(self, engine):
        status, headers, raw = http("POST", engine.url + "/v1/completions",
                                    {"prompt": "x", "max_tokens": 4, "stream": True})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert len(events) == 5

    def test_unknown_model_is_404_like_vllm(self, engine):
        status, r = http_json("POST", engine.url + "/v1/completions", {"model": "nope", "prompt": "x"})
        assert status == 404
        assert "does not exist" in r["error"]["message"]

    def test_request_longer_than_max_model_len_is_400(self, engine):
        status, r = http_json("POST", engine.url + "/v1/completions", {"prompt": "x" * 20000, "max_tokens": 10})
        assert status == 400
        assert "maximum context length is 4096 tokens" in r["error"]["message"]

    def test_token_shift_changes_the_tokens(self, servers):
        body = {"prompt": "same prompt", "max_tokens": 8}
        base = servers.engine()
        shifted = servers.engine(env=clean_env(PD_STANDIN_TOKEN_SHIFT="1"))
        a = http_json("POST", base.url + "/v1/completions", body)[1]["choices"][0]["text"]
        b = http_json("POST", shifted.url + "/v1/completions", body)[1]["choices"][0]["text"]
        assert a != b and len(b.split()) == 8


# --------------------------------------------------------------------------- PD protocol
def hybrid(role: str, engine_id: str, kv_port: int) -> str:
    return json.dumps({"kv_connector": "MooncakeHybridConnector", "kv_role": role, "engine_id": engine_id,
                       "kv_port": str(kv_port)})


def post(url: str, path: str, body: dict, headers: dict | None = None):
    """(status, headers, json) with extra request headers."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"null")


class TestPdProtocol:
    """kv_transfer_params as vllm-ascend's Mooncake connectors produce and need them
    (kv_p2p/mooncake_connector.py, kv_p2p/mooncake_hybrid_connector.py; v0.23.0 .. main)."""

    def test_hybrid_prefill_answer(self, servers):
        # DP rank 1 of DP2 x TP4: Mooncake's handshake port is kv_port + dp_rank x tp = 30000 + 4;
        # vLLM appends _dp<rank> to the engine id when DP size > 1 (vllm/v1/engine/core.py).
        srv = servers.engine("-dp", "2", "--data-parallel-rank", "1", "-tp", "4", "--block-size", "128",
                             "--kv-transfer-config", hybrid("kv_producer", "7", 30000),
                             "--no-disable-hybrid-kv-cache-manager", "--max-model-len", "4096",
                             env=clean_env(VLLM_HOST_IP="10.0.0.5"))
        prompt = "x" * 1200  # 300 stand-in tokens -> ceil(300 / 128) = 3 blocks per group
        status, _, r = post(srv.url, "/v1/completions",
                            {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
                            {"X-Request-Id": "abc"})
        assert status == 200
        kvp = r["kv_transfer_params"]
        assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
        assert kvp["remote_engine_id"] == "7_dp1"
        assert kvp["remote_port"] == 30004
        assert kvp["remote_host"] == "10.0.0.5"  # VLLM_HOST_IP, not the bind address 127.0.0.1
        assert re.fullmatch(r"cmpl-abc-0-[0-9a-f]{8}", kvp["remote_request_id"])
        assert r["id"] == "cmpl-abc"
        groups = kvp["remote_block_ids"]
        assert len(groups) == 2 and all(len(g) == 3 for g in groups)
        assert kvp["remote_ptp_size"] == 4 and kvp["num_prompt_blocks"] == 3
        assert set(kvp) == {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                            "remote_request_id", "remote_host", "remote_port", "remote_ptp_size",
                            "last_token_id", "remote_multi_nodes_meta_mapping", "num_prompt_blocks"}

    def test_v1_prefill_answer_has_its_extra_keys(self, servers):
        srv = servers.engine("--kv-transfer-config", MB_PRODUCER, "--block-size", "64")
        r = http_json("POST", srv.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True}})[1]
        kvp = r["kv_transfer_params"]
        assert kvp["remote_port"] == 30000 and kvp["remote_engine_id"] == "0"
        assert kvp["remote_pcp_size"] == 1 and kvp["remote_dcp_size"] == 1 and kvp["remote_block_size"] == 64
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}-[0-9a-f]{8}", kvp["remote_request_id"])
        # a KV connector without the hybrid manager flag turns it off: one KV cache group
        assert len(kvp["remote_block_ids"]) == 1

    def test_multiconnector_child_kv_port_is_used(self, servers):
        ktc = {"kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "3",
               "kv_connector_extra_config": {"connectors": [
                   {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "31000"},
                   {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}]}}
        srv = servers.engine("-dp", "2", "--data-parallel-rank", "1", "-tp", "2",
                             "--kv-transfer-config", json.dumps(ktc))
        kvp = http_json("POST", srv.url + "/v1/completions", {
            "prompt": "p", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})[1]["kv_transfer_params"]
        assert kvp["remote_port"] == 31002 and kvp["remote_engine_id"] == "3_dp1"

    def test_no_mooncake_connector_answers_null(self, servers):
        srv = servers.engine()
        r = http_json("POST", srv.url + "/v1/completions", {
            "prompt": "p", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})[1]
        assert r["kv_transfer_params"] is None

    def test_remote_host_is_not_the_bind_address_without_vllm_host_ip(self, servers, tmp_path):
        hosts = tmp_path / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n192.0.2.7 {socket.gethostname()} other\n")
        srv = servers.engine("--kv-transfer-config", MB_PRODUCER, env=clean_env(PD_STANDIN_HOSTS_FILE=hosts))
        kvp = http_json("POST", srv.url + "/v1/completions", {
            "prompt": "p", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})[1]["kv_transfer_params"]
        assert kvp["remote_host"] == "192.0.2.7"

    @pytest.fixture
    def decode(self, servers):
        return servers.engine("--kv-transfer-config", hybrid("kv_consumer", "1", 30100),
                              "--no-disable-hybrid-kv-cache-manager")

    def good_params(self):
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2], [3, 4]],
                "remote_engine_id": "0", "remote_request_id": "cmpl-x-0-12345678",
                "remote_host": "10.0.0.5", "remote_port": 30000}

    def test_decode_accepts_a_real_prefill_answer(self, decode):
        status, r = http_json("POST", decode.url + "/v1/completions",
                              {"prompt": "p", "max_tokens": 3, "kv_transfer_params": self.good_params()})
        assert status == 200 and r["usage"]["completion_tokens"] == 3

    @pytest.mark.parametrize("change, why", [
        ({"remote_request_id": None}, "missing remote_request_id"),
        ({"remote_host": None}, "missing remote_host"),
        ({"remote_port": None}, "missing remote_port"),
        ({"remote_block_ids": [1, 2, 3, 4]}, "one list of block ids per KV cache group"),
        ({"remote_block_ids": [[1, 2]]}, "has 1 KV cache groups, this engine has 2"),
        ({"remote_block_ids": None}, "remote_block_ids is empty"),
        ({"remote_port": "30000"}, "remote_port '30000' is not an integer"),
    ])
    def test_decode_refuses_what_mooncake_could_not_pull(self, decode, change, why):
        params = self.good_params()
        for key, value in change.items():
            if value is None and key != "remote_block_ids":
                del params[key]
            else:
                params[key] = value
        status, r = http_json("POST", decode.url + "/v1/completions",
                              {"prompt": "p", "max_tokens": 3, "kv_transfer_params": params})
        assert status == 400 and why in r["error"]["message"]
        assert "Got invalid KVTransferParams. params=" in decode.output()

    def test_what_the_proxy_sends_a_prefill_is_not_a_decode_answer(self, decode):
        """The proxy's prefill request (all remote_* null, do_remote_decode) reaching a decode."""
        proxy_prefill = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                         "remote_block_ids": None, "remote_host": None, "remote_port": None}
        status, _ = http_json("POST", decode.url + "/v1/completions",
                              {"prompt": "p", "max_tokens": 1, "kv_transfer_params": proxy_prefill})
        assert status == 200  # do_remote_prefill false: nothing to pull, decode computes alone


class TestRequestIds:
    def test_x_request_id_names_the_answer(self, servers):
        srv = servers.engine()
        _, headers, r = post(srv.url, "/v1/completions", {"prompt": "p", "max_tokens": 1}, {"X-Request-Id": "r1"})
        assert r["id"] == "cmpl-r1"
        assert headers.get("X-Request-Id") is None  # echoed only with --enable-request-id-headers
        assert received_ids(srv)[-1]["x_request_id"] == "r1"
        _, _, r = post(srv.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "p"}],
                                                          "max_tokens": 1}, {"X-Request-Id": "r2"})
        assert r["id"] == "chatcmpl-r2"

    def test_without_header_the_body_request_id_then_a_random_one(self, servers):
        srv = servers.engine()
        r = http_json("POST", srv.url + "/v1/completions", {"prompt": "p", "max_tokens": 1, "request_id": "b7"})[1]
        assert r["id"] == "cmpl-b7"
        r = http_json("POST", srv.url + "/v1/completions", {"prompt": "p", "max_tokens": 1})[1]
        assert re.fullmatch(r"cmpl-[0-9a-f]{32}", r["id"])

    def test_enable_request_id_headers_echoes_it(self, servers):
        srv = servers.engine("--enable-request-id-headers")
        _, headers, _ = post(srv.url, "/v1/completions", {"prompt": "p", "max_tokens": 1}, {"X-Request-Id": "r9"})
        assert headers["X-Request-Id"] == "r9"
        status, headers, _ = http("GET", srv.url + "/health")
        assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", headers["X-Request-Id"])


def received_ids(srv) -> list[dict]:
    return http_json("GET", srv.url + "/standin/requests")[1]


class TestApiKey:
    """--api-key guards /v1 (and /v2, /inference, /cohere) only (vLLM 0.27.1 server_utils.py)."""

    def test_v1_needs_the_bearer_key_health_does_not(self, servers):
        srv = servers.engine("--api-key", "k1", "k2")
        assert http("GET", srv.url + "/health")[0] == 200
        assert http_json("GET", srv.url + "/v1/models") == (401, {"error": "Unauthorized"})
        status, _, _ = post(srv.url, "/v1/completions", {"prompt": "p", "max_tokens": 1},
                            {"Authorization": "Bearer k2"})
        assert status == 200
        assert post(srv.url, "/v1/completions", {"prompt": "p"}, {"Authorization": "Bearer nope"})[0] == 401

    def test_vllm_api_key_env_when_no_flag(self, servers):
        srv = servers.engine(env=clean_env(VLLM_API_KEY="e1"))
        assert http("GET", srv.url + "/v1/models")[0] == 401
        assert post(srv.url, "/v1/completions", {"prompt": "p", "max_tokens": 1},
                    {"Authorization": "Bearer e1"})[0] == 200


# --------------------------------------------------------------------------- metrics
def families(url: str) -> dict:
    status, headers, raw = http("GET", url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(raw.decode())}


class TestMetrics:
    def test_the_vllm_metrics_parse_with_prometheus_client(self, servers):
        srv = servers.engine("--served-model-name", "dsv4")
        for _ in range(3):
            http_json("POST", srv.url + "/v1/completions", {"prompt": "hello", "max_tokens": 2})
        fam = families(srv.url)
        assert fam["vllm:num_requests_running"].type == "gauge"
        assert fam["vllm:num_requests_waiting"].type == "gauge"
        assert fam["vllm:kv_cache_usage_perc"].type == "gauge"
        assert fam["vllm:num_preemptions"].type == "counter"
        assert fam["vllm:time_to_first_token_seconds"].type == "histogram"
        for f in fam.values():
            assert all(s.labels["model_name"] == "dsv4" for s in f.samples)
        ttft = {s.name: s.value for s in fam["vllm:time_to_first_token_seconds"].samples if "le" not in s.labels}
        assert ttft["vllm:time_to_first_token_seconds_count"] == 3
        assert fam["vllm:generation_tokens"].samples[0].value == 6
        assert fam["vllm:num_preemptions"].samples[0].name == "vllm:num_preemptions_total"

    def test_values_forced_by_env_and_at_run_time(self, servers):
        env = clean_env(PD_STANDIN_METRICS_RUNNING="1", PD_STANDIN_METRICS_WAITING="5",
                        PD_STANDIN_METRICS_KV_CACHE_USAGE="0.93", PD_STANDIN_METRICS_PREEMPTIONS="4",
                        PD_STANDIN_METRICS_TTFT_SECONDS="2.0")
        srv = servers.engine(env=env)
        http_json("POST", srv.url + "/v1/completions", {"prompt": "hello", "max_tokens": 1})
        fam = families(srv.url)

        def value(name):
            return fam[name].samples[0].value

        assert value("vllm:num_requests_running") == 1
        assert value("vllm:num_requests_waiting") == 5
        assert value("vllm:kv_cache_usage_perc") == 0.93
        assert value("vllm:num_preemptions") == 4
        ttft = {s.labels.get("le"): s.value for s in fam["vllm:time_to_first_token_seconds"].samples
                if s.name.endswith("_bucket")}
        assert ttft["1.0"] == 0 and ttft["2.5"] == 1
        assert http_json("POST", srv.url + "/standin/metrics", {"waiting": 0})[0] == 200
        assert families(srv.url)["vllm:num_requests_waiting"].samples[0].value == 0

    def test_preempt_every_counts_and_logs_on_a_recompute_decoder(self, servers):
        srv = servers.engine("--kv-transfer-config", MB_CONSUMER, "--additional-config", RECOMPUTE_NESTED,
                             env=clean_env(PD_STANDIN_PREEMPT_EVERY="2"))
        for _ in range(4):
            http_json("POST", srv.url + "/v1/completions", {"prompt": "p", "max_tokens": 1})
        assert families(srv.url)["vllm:num_preemptions"].samples[0].value == 2
        assert "[RecomputeScheduler] Recompute triggered for request" in srv.output()


# --------------------------------------------------------------------------- faults
class TestFaults:
    def test_crash_on_start(self):
        r = run_engine(["serve", "/m", "--port", str(free_port())], env=clean_env(PD_STANDIN_FAULT="crash_on_start"))
        assert r.returncode == 1
        assert "Engine core initialization failed" in r.stderr

    def test_never_healthy(self, servers):
        srv = servers.engine(env=clean_env(PD_STANDIN_FAULT="never_healthy"), wait=False)
        srv.wait_http("/health", want=503)
        time.sleep(0.3)
        assert http("GET", srv.url + "/health")[0] == 503
        assert http("POST", srv.url + "/v1/completions", {"prompt": "x"})[0] == 503

    def test_a_running_engine_can_be_wedged_and_healed(self, servers):
        srv = servers.engine()
        assert http("GET", srv.url + "/health")[0] == 200
        assert http_json("POST", srv.url + "/standin/health", {"healthy": False}) == (200, {"healthy": False})
        assert http("GET", srv.url + "/health")[0] == 503
        assert http("POST", srv.url + "/v1/completions", {"prompt": "x"})[0] == 503
        http_json("POST", srv.url + "/standin/health", {"healthy": True})
        assert http("GET", srv.url + "/health")[0] == 200

    def test_exit_after_start(self, servers):
        srv = servers.engine(env=clean_env(PD_STANDIN_FAULT="exit_after_start", PD_STANDIN_EXIT_AFTER="0.5"))
        assert srv.proc.wait(timeout=10) == 1
        assert "died unexpectedly" in srv.output()

    def test_start_delay_keeps_the_port_closed(self, servers):
        srv = servers.engine(env=clean_env(PD_STANDIN_START_DELAY="1.5"), wait=False)
        time.sleep(0.5)
        with pytest.raises(OSError):
            http("GET", srv.url + "/health", timeout=1)
        srv.wait_http("/health")
        assert "simulated start delay 1.5s" in srv.output()

    def test_unknown_fault_is_an_error(self):
        r = run_engine(["serve", "/m"], env=clean_env(PD_STANDIN_FAULT="typo"))
        assert r.returncode == 1

    def test_oom_above_batched_tokens(self):
        env = clean_env(PD_STANDIN_OOM_ABOVE_BATCHED_TOKENS="49152")
        r = run_engine(["serve", "/m", "--max-num-batched-tokens", "65536"], env=env)
        assert r.returncode == 1
        assert "NPU out of memory" in r.stderr

    def test_sigterm_stops_it_promptly(self, servers):
        srv = servers.engine()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=5) == 0
