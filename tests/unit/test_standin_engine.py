"""The stand-in `vllm serve` (tests/fixtures/images/vllm-ascend-standin/vllm_standin.py):
strict flags, vllm-ascend start-up rules, the KV start-up lines and their footprint
model, the HTTP routes, /metrics, and the fault switches. Runs the script as a
subprocess on 127.0.0.1; no Docker."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.standin_procs import HOST, Servers, clean_env, free_port, http, http_json, run_engine

GIB = 1024**3
MB_CONSUMER = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
                          "engine_id": "1", "kv_port": "30100"})
KV_BOTH = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both"})
RECOMPUTE_NESTED = json.dumps({"scheduler_config": {"recompute_scheduler_enable": True}})
RECOMPUTE_TOP = json.dumps({"recompute_scheduler_enable": True})


@pytest.fixture
def servers(tmp_path):
    s = Servers(tmp_path)
    yield s
    s.stop_all()


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
    def test_recompute_on_a_kv_both_engine_refuses_to_start(self):
        r = run_engine(["serve", "/m", "--kv-transfer-config", KV_BOTH, "--additional-config", RECOMPUTE_NESTED])
        assert r.returncode == 1
        assert "recompute_scheduler_enable is only supported on decode" in r.stderr
        assert "'kv_both'" in r.stderr

    def test_recompute_without_any_connector_refuses_to_start(self):
        r = run_engine(["serve", "/m", "--additional-config", RECOMPUTE_TOP])
        assert r.returncode == 1
        assert "kv_role None" in r.stderr

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

    def test_partial_prefills_above_one_warn_and_reset(self, servers):
        srv = servers.engine("--max-num-partial-prefills", "2", "--max-long-partial-prefills", "1")
        out = srv.output()
        assert re.search(r"WARNING .*max_num_partial_prefills=2 is not supported .* reset to 1", out)

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
        assert "tensor_parallel_size=4 needs 4 NPUs but the container has 2" in r.stderr

    def test_enough_npus_start(self, tmp_path, servers):
        root = fake_tree(tmp_path, npus=4)
        servers.engine("-tp", "4", env=clean_env(PD_STANDIN_CHECK_DEVICES="1", PD_STANDIN_ROOT=root))


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

    def test_remote_decode_request_gets_one_token_and_kv_params(self, engine):
        status, r = http_json("POST", engine.url + "/v1/completions", {
            "prompt": "long prompt", "max_tokens": 50, "kv_transfer_params": {"do_remote_decode": True}})
        assert status == 200
        assert r["usage"]["completion_tokens"] == 1
        kvp = r["kv_transfer_params"]
        assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
        assert kvp["remote_engine_id"] == "1" and kvp["remote_port"] == "30100"

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
