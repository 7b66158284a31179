"""The stand-in PD proxy (tests/fixtures/images/vllm-ascend-standin/proxy_standin.py):
flags like the real load_balance_proxy_server_example.py, routing prefill then decode
with kv_transfer_params, round-robin, health, /v1/models and instance add/remove.
Runs the proxy and stand-in engines as subprocesses on 127.0.0.1; no Docker."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.fixtures.standin_procs import PROXY, Servers, clean_env, http, http_json

P_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "engine_id": "0",
                    "kv_port": "30000"})
D_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "engine_id": "1",
                    "kv_port": "30100"})
COMMON = ("--served-model-name", "dsv4", "--max-model-len", "8192", "--no-disable-hybrid-kv-cache-manager")


@pytest.fixture
def servers(tmp_path):
    s = Servers(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def pd(servers):
    """2 prefillers, 2 decoders and a proxy in front of them."""
    prefill = [servers.engine(*COMMON, "--kv-transfer-config", P_KTC) for _ in range(2)]
    decode = [servers.engine(*COMMON, "--kv-transfer-config", D_KTC) for _ in range(2)]
    proxy = servers.proxy(prefill, decode, "--waiting-retry-interval", "0.2")
    return prefill, decode, proxy


def received(engine) -> list[dict]:
    return http_json("GET", engine.url + "/standin/requests")[1]


def run_proxy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROXY), *args], env=clean_env(), capture_output=True,
                          text=True, timeout=20, check=False)


class TestFlags:
    def test_unequal_prefiller_lists_are_an_error(self):
        r = run_proxy("--prefiller-hosts", "127.0.0.1", "127.0.0.1", "--prefiller-ports", "8100")
        assert r.returncode == 1
        assert "Number of prefiller hosts must match number of prefiller ports" in r.stderr

    def test_unequal_decoder_lists_are_an_error(self):
        r = run_proxy("--decoder-hosts", "127.0.0.1", "--decoder-ports", "8200", "8201")
        assert r.returncode == 1
        assert "Number of decoder hosts must match number of decoder ports" in r.stderr

    def test_unknown_flag_exits_2(self):
        r = run_proxy("--prefill-hosts", "127.0.0.1")
        assert r.returncode == 2
        assert "unrecognized arguments" in r.stderr

    def test_ports_must_be_integers(self):
        r = run_proxy("--prefiller-ports", "eighty")
        assert r.returncode == 2


class TestRouting:
    def test_completion_goes_to_a_prefiller_then_a_decoder(self, pd):
        prefill, decode, proxy = pd
        body = {"model": "dsv4", "prompt": "Explain KV cache offload", "max_tokens": 6}
        status, r = http_json("POST", proxy.url + "/v1/completions", body)
        assert status == 200
        assert r["usage"]["completion_tokens"] == 6
        # the answer is the decoder's full answer, same tokens as one engine alone
        alone = http_json("POST", decode[1].url + "/v1/completions", body)[1]
        assert r["choices"][0]["text"] == alone["choices"][0]["text"]

        p_reqs = [q for e in prefill for q in received(e)]
        assert len(p_reqs) == 1
        p_body = p_reqs[0]["body"]
        assert p_body["max_tokens"] == 1 and p_body["stream"] is False
        assert p_body["kv_transfer_params"]["do_remote_decode"] is True

        d_reqs = received(decode[0])
        assert len(d_reqs) == 1
        d_body = d_reqs[0]["body"]
        assert d_body["max_tokens"] == 6
        assert d_body["kv_transfer_params"]["do_remote_prefill"] is True
        assert d_body["kv_transfer_params"]["remote_engine_id"] == "0"
        assert d_body["kv_transfer_params"]["remote_port"] == "30000"

    def test_chat_completion_is_routed_too(self, pd):
        prefill, decode, proxy = pd
        status, r = http_json("POST", proxy.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
        assert status == 200
        assert len(r["choices"][0]["message"]["content"].split()) == 3
        assert received(prefill[0])[0]["path"] == "/v1/chat/completions"

    def test_round_robin_over_both_roles(self, pd):
        prefill, decode, proxy = pd
        for i in range(4):
            assert http_json("POST", proxy.url + "/v1/completions", {"prompt": f"q{i}", "max_tokens": 2})[0] == 200
        assert [len(received(e)) for e in prefill] == [2, 2]
        assert [len(received(e)) for e in decode] == [2, 2]

    def test_streaming_passes_through(self, pd):
        _, _, proxy = pd
        status, headers, raw = http("POST", proxy.url + "/v1/completions",
                                    {"prompt": "stream me", "max_tokens": 3, "stream": True})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) == 4

    def test_backend_errors_are_passed_through(self, pd):
        _, _, proxy = pd
        status, r = http_json("POST", proxy.url + "/v1/completions", {"model": "nope", "prompt": "x"})
        assert status == 404
        assert "does not exist" in r["error"]["message"]

    def test_unreachable_backend_is_a_502_after_retries(self, servers):
        dead = servers.engine()
        dead.stop()
        proxy = servers.proxy([dead], [dead], "--max-retries", "2", "--retry-delay", "0.01")
        status, r = http_json("POST", proxy.url + "/v1/completions", {"prompt": "x"})
        assert status == 502
        assert "Attempt 1 failed" in proxy.output()


class TestControlRoutes:
    def test_healthcheck(self, pd):
        _, _, proxy = pd
        status, r = http_json("GET", proxy.url + "/healthcheck")
        assert status == 200
        assert r == {"status": "ok", "prefill_instances": 2, "decode_instances": 2, "request_num": 0}

    def test_models_come_from_a_backend(self, pd):
        _, _, proxy = pd
        status, r = http_json("GET", proxy.url + "/v1/models")
        assert status == 200 and r["data"][0]["id"] == "dsv4"

    def test_add_waits_for_the_instance_then_remove(self, servers, pd):
        prefill, decode, proxy = pd
        extra = servers.engine(*COMMON, "--kv-transfer-config", D_KTC)
        status, r = http_json("POST", proxy.url + "/instances/add",
                              {"type": "decode", "instances": [f"127.0.0.1:{extra.port}"]})
        assert status == 200 and "waiting to be added" in r["message"]
        deadline = time.monotonic() + 10
        while http_json("GET", proxy.url + "/healthcheck")[1]["decode_instances"] != 3:
            assert time.monotonic() < deadline, proxy.output()
            time.sleep(0.1)
        status, r = http_json("POST", proxy.url + "/instances/remove",
                              {"type": "decode", "instances": f"127.0.0.1:{extra.port}"})
        assert status == 200
        assert f"127.0.0.1:{extra.port}" not in r["current_decode_instances"]
        assert http_json("GET", proxy.url + "/healthcheck")[1]["decode_instances"] == 2

    def test_an_instance_that_never_answers_is_dropped(self, pd):
        _, _, proxy = pd
        http_json("POST", proxy.url + "/instances/add", {"type": "prefill", "instances": ["127.0.0.1:1"]})
        deadline = time.monotonic() + 10
        while "was not added to the proxy" not in proxy.output():
            assert time.monotonic() < deadline, proxy.output()
            time.sleep(0.1)
        assert http_json("GET", proxy.url + "/healthcheck")[1]["prefill_instances"] == 2

    def test_unknown_instance_type(self, pd):
        _, _, proxy = pd
        r = http_json("POST", proxy.url + "/instances/add", {"type": "both", "instances": ["127.0.0.1:9"]})[1]
        assert "is not supported" in r["error"]
