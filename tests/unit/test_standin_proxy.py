"""The stand-in PD proxy (tests/fixtures/images/vllm_ascend_standin/proxy_standin.py):
flags like the real load_balance_proxy_server_example.py, routing prefill then decode
with kv_transfer_params, round-robin, health, /v1/models and instance add/remove.
Runs the proxy and stand-in engines as subprocesses on 127.0.0.1; no Docker."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.fixtures.images.vllm_ascend_standin import proxy_standin
from tests.fixtures.standin_procs import PROXY, clean_env, http, http_json

P_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "engine_id": "0",
                    "kv_port": "30000"})
D_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "engine_id": "1",
                    "kv_port": "30100"})
COMMON = ("--served-model-name", "dsv4", "--max-model-len", "8192", "--no-disable-hybrid-kv-cache-manager")


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


MAIN = {"PD_STANDIN_ASCEND_VERSION": "main"}


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
        assert p_body["max_tokens"] == 1 and p_body["min_tokens"] == 1 and p_body["stream"] is False
        assert p_body["kv_transfer_params"] == {
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}

        d_reqs = received(decode[0])
        assert len(d_reqs) == 1
        d_body = d_reqs[0]["body"]
        assert d_body["max_tokens"] == 6
        kvp = d_body["kv_transfer_params"]
        # what the Mooncake prefill answered, forwarded untouched (stand-in P: engine_id 0, kv_port 30000)
        assert kvp["do_remote_prefill"] is True and kvp["remote_engine_id"] == "0"
        assert kvp["remote_port"] == 30000
        assert kvp["remote_request_id"] == p_reqs[0]["request_id"]
        # one X-Request-Id per client request, the same on P and D; the key from OPENAI_API_KEY
        assert re.fullmatch(r"[0-9a-f-]{36}", p_reqs[0]["x_request_id"])
        assert d_reqs[0]["x_request_id"] == p_reqs[0]["x_request_id"]
        assert r["id"] == "cmpl-" + p_reqs[0]["x_request_id"]
        assert p_reqs[0]["authorization"] == d_reqs[0]["authorization"] == "Bearer None"

    def test_chat_completion_is_routed_too(self, pd):
        prefill, decode, proxy = pd
        status, r = http_json("POST", proxy.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
        assert status == 200
        assert len(r["choices"][0]["message"]["content"].split()) == 3
        assert received(prefill[0])[0]["path"] == "/v1/chat/completions"
        assert received(decode[0])[0]["body"]["kv_transfer_params"]["remote_request_id"].startswith("chatcmpl-")

    def test_openai_api_key_is_sent_to_backends(self, servers):
        key_env = clean_env(OPENAI_API_KEY="sk-1")
        p = servers.engine(*COMMON, "--kv-transfer-config", P_KTC, "--api-key", "sk-1")
        d = servers.engine(*COMMON, "--kv-transfer-config", D_KTC, "--api-key", "sk-1")
        proxy = servers.proxy([p], [d], env=key_env)
        assert http_json("POST", proxy.url + "/v1/completions", {"prompt": "q", "max_tokens": 2})[0] == 200
        assert received_with_key(p, "sk-1")[0]["authorization"] == "Bearer sk-1"

    def test_idle_proxy_sends_every_request_to_the_first_instance(self, pd):
        """Least-loaded pick, ties to the instance listed first (the real proxy's heap of
        (load, ordinal)); one request at a time leaves every load back at 0."""
        prefill, decode, proxy = pd
        for i in range(3):
            assert http_json("POST", proxy.url + "/v1/completions", {"prompt": f"q{i}", "max_tokens": 2})[0] == 200
        assert [len(received(e)) for e in prefill] == [3, 0]
        assert [len(received(e)) for e in decode] == [3, 0]

    def test_streaming_passes_through(self, pd):
        _, _, proxy = pd
        status, headers, raw = http("POST", proxy.url + "/v1/completions",
                                    {"prompt": "stream me", "max_tokens": 3, "stream": True})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) == 4

    def test_a_decode_error_is_200_with_an_empty_body(self, servers):
        """The real proxy has answered 200 (StreamingResponse) before it asks the decoder;
        a decode failure only ends the body (every checked ref)."""
        p = servers.engine(*COMMON, "--kv-transfer-config", P_KTC)
        d = servers.engine("--served-model-name", "other", "--max-model-len", "8192",
                           "--kv-transfer-config", D_KTC, "--no-disable-hybrid-kv-cache-manager")
        for env in (clean_env(), clean_env(**MAIN)):
            proxy = servers.proxy([p], [d], "--retry-delay", "0.01", env=env)
            status, headers, raw = http("POST", proxy.url + "/v1/completions", {"model": "dsv4", "prompt": "x"})
            assert (status, raw) == (200, b"")
            assert headers["Content-Type"] == "application/json"
            assert "Error during streaming from decoder" in proxy.output()

    def test_a_decode_that_cannot_pull_the_kv_is_caught(self, servers):
        """A prefill without a Mooncake connector answers kv_transfer_params null; the proxy then
        forwards the client's own params. A decode given do_remote_prefill without the keys
        refuses ('Got invalid KVTransferParams'), and the client sees 200 with an empty body."""
        p = servers.engine(*COMMON)
        d = servers.engine(*COMMON, "--kv-transfer-config", D_KTC)
        proxy = servers.proxy([p], [d], "--max-retries", "1")
        status, _, raw = http("POST", proxy.url + "/v1/completions", {
            "prompt": "x", "max_tokens": 2, "kv_transfer_params": {"do_remote_prefill": True,
                                                                   "remote_block_ids": [[1]]}})
        assert (status, raw) == (200, b"")
        assert "Got invalid KVTransferParams" in d.output()

    @pytest.mark.parametrize("env, status", [({}, 500), (MAIN, 404)])
    def test_a_prefill_error_per_version(self, pd, servers, env, status):
        """v0.23 .. v0.26: the error is re-raised, Starlette answers 500; main relays the
        backend's status and body."""
        prefill, decode, _ = pd
        proxy = servers.proxy(prefill, decode, "--retry-delay", "0.01", env=clean_env(**env))
        code, headers, raw = http("POST", proxy.url + "/v1/completions", {"model": "nope", "prompt": "x"})
        assert code == status
        if status == 500:
            assert raw == b"Internal Server Error"
            assert prefill[0].output().count('"POST /v1/completions HTTP/1.1" 404') == 3  # retried
        else:
            assert "does not exist" in json.loads(raw)["error"]["message"]

    def test_a_prefill_400_is_not_retried_on_main(self, pd, servers):
        prefill, decode, _ = pd
        proxy = servers.proxy(prefill, decode, "--retry-delay", "0.01", env=clean_env(**MAIN))
        code, _ = http_json("POST", proxy.url + "/v1/completions", {"prompt": "x" * 40000, "max_tokens": 5})
        assert code == 400
        assert prefill[0].output().count('"POST /v1/completions HTTP/1.1" 400') == 1

    def test_unreachable_prefill_is_a_500_after_retries(self, servers):
        dead = servers.engine()
        dead.stop()
        proxy = servers.proxy([dead], [dead], "--max-retries", "2", "--retry-delay", "0.01")
        status, _, raw = http("POST", proxy.url + "/v1/completions", {"prompt": "x"})
        assert (status, raw) == (500, b"Internal Server Error")
        assert "Attempt 1 failed" in proxy.output()

    def test_main_adds_the_prefill_cached_tokens_to_usage(self, pd, servers):
        prefill, decode, _ = pd
        proxy = servers.proxy(prefill, decode, env=clean_env(**MAIN))
        r = http_json("POST", proxy.url + "/v1/completions", {"prompt": "q", "max_tokens": 2})[1]
        assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        old = servers.proxy(prefill, decode)
        r = http_json("POST", old.url + "/v1/completions", {"prompt": "q", "max_tokens": 2})[1]
        assert "prompt_tokens_details" not in r["usage"]


def received_with_key(engine, key: str) -> list[dict]:
    req = urllib.request.Request(engine.url + "/standin/requests", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


class TestControlRoutes:
    def test_healthcheck(self, pd):
        _, _, proxy = pd
        status, r = http_json("GET", proxy.url + "/healthcheck")
        assert status == 200
        assert r == {"status": "ok", "prefill_instances": 2, "decode_instances": 2, "request_num": 0}

    def test_models_is_404_before_main(self, pd):
        """The route appears in the proxy example on main only (absent at v0.23.0 .. releases/v0.26.0rc)."""
        _, _, proxy = pd
        assert http_json("GET", proxy.url + "/v1/models") == (404, {"detail": "Not Found"})

    def test_models_come_from_a_backend_on_main(self, pd, servers):
        prefill, decode, _ = pd
        proxy = servers.proxy(prefill, decode, env=clean_env(**MAIN))
        status, r = http_json("GET", proxy.url + "/v1/models")
        assert status == 200 and r["data"][0]["id"] == "dsv4"

    def test_models_503_when_no_backend_answers_on_main(self, servers):
        dead = servers.engine()
        dead.stop()
        proxy = servers.proxy([dead], [dead], env=clean_env(**MAIN))
        status, r = http_json("GET", proxy.url + "/v1/models")
        assert status == 503 and r["error"] == "All backend instances failed to serve /v1/models"
        assert r["failed"] == [f"127.0.0.1:{dead.port}"] * 2

    def test_add_waits_for_the_instance_then_remove(self, servers, pd):
        prefill, decode, proxy = pd
        extra = servers.engine(*COMMON, "--kv-transfer-config", D_KTC)
        status, r = http_json("POST", proxy.url + "/instances/add",
                              {"type": "decode", "instances": [f"127.0.0.1:{extra.port}"]})
        assert status == 200 and r["message"] == f"Instances ['127.0.0.1:{extra.port}'] are waiting to be added."
        deadline = time.monotonic() + 10
        while http_json("GET", proxy.url + "/healthcheck")[1]["decode_instances"] != 3:
            assert time.monotonic() < deadline, proxy.output()
            time.sleep(0.1)
        status, r = http_json("POST", proxy.url + "/instances/remove",
                              {"type": "decode", "instances": f"127.0.0.1:{extra.port}"})
        assert status == 200
        assert r["message"] == f"remove decode instances: ['127.0.0.1:{extra.port}']."
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

    def test_unknown_instance_type_is_a_200_with_an_error(self, pd):
        _, _, proxy = pd
        status, r = http_json("POST", proxy.url + "/instances/add", {"type": "both", "instances": ["127.0.0.1:9"]})
        assert status == 200 and "is not supported" in r["error"]

    def test_malformed_instance_is_a_500(self, pd):
        _, _, proxy = pd
        status, _, raw = http("POST", proxy.url + "/instances/add", {"type": "decode", "instances": ["no-port"]})
        assert (status, raw) == (500, b"Internal Server Error")


class TestPools:
    """The scheduling state, called directly (no HTTP)."""

    def pools(self, **over):
        mod = proxy_standin
        args = mod.parse_args(["--prefiller-hosts", "127.0.0.1", "localhost", "--prefiller-ports", "1", "2",
                               "--decoder-hosts", "127.0.0.1", "--decoder-ports", "3"])
        return mod, mod.Pools(args)

    def test_least_loaded_with_first_listed_on_ties(self):
        _, pools = self.pools()
        first = pools.pick("prefill", 500.0, first=True)
        second = pools.pick("prefill", 10.0, first=True)
        assert (first[2], second[2]) == (1, 2)
        third = pools.pick("prefill", 1.0, first=True)
        assert third[2] == 2  # 10 + 1 pending on port 2 is still below 500 on port 1

    def test_localhost_and_loopback_are_one_instance(self):
        _, pools = self.pools()
        assert pools.add("decode", [("localhost", 3)]) == []  # already there as 127.0.0.1:3

    def test_remove_while_busy_isolates_then_drains(self):
        _, pools = self.pools()
        pools.pick("decode", 1.0, first=True)  # one request in flight
        assert pools.remove("decode", [("127.0.0.1", 3)]) is True
        assert pools.health()["decode_instances"] == 1  # still listed, but never picked first
        pools.finish()
        pools.finalize_tainted()
        assert pools.health()["decode_instances"] == 0

    def test_prefill_score_follows_the_request_length(self):
        mod, _ = self.pools()
        assert mod.prefill_score(400) == pytest.approx(100 * 0.0345 + 120.0745)
