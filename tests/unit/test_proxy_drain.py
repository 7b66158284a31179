"""Drain and restore of ranks in a running PD proxy (module_utils/pd_drain.py, the pd_proxy_drain module).

Against the stand-in proxy and engines on 127.0.0.1 (they follow vllm-ascend's proxy: isolation of a
busy instance, removal once the proxy is idle, add only after /v1/models answers), and with a fake
clock where only the bound is tested. Nothing else is contacted.
"""

import json
import threading
import time
from pathlib import Path

import ansible.module_utils
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils import pd_drain  # noqa: E402  (needs the path above)
from tests.fixtures.fake_clock import FakeClock  # noqa: E402
from tests.fixtures.standin_procs import Servers, clean_env, http, http_json  # noqa: E402

P_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "engine_id": "0",
                    "kv_port": "30000"})
D_KTC = json.dumps({"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "engine_id": "1",
                    "kv_port": "30100"})
COMMON = ("--served-model-name", "dsv4", "--max-model-len", "8192", "--no-disable-hybrid-kv-cache-manager")
TOKEN_S = 0.1


@pytest.fixture
def pd(tmp_path):
    """1 prefill, 2 decodes (each generated token takes TOKEN_S) and a proxy in front of them."""
    servers = Servers(tmp_path)
    env = clean_env(PD_STANDIN_TOKEN_SECONDS=TOKEN_S)
    prefill = [servers.engine(*COMMON, "--kv-transfer-config", P_KTC, env=env)]
    decode = [servers.engine(*COMMON, "--kv-transfer-config", D_KTC, env=env) for _ in range(2)]
    proxy = servers.proxy(prefill, decode, "--waiting-retry-interval", "0.2")
    yield prefill, decode, proxy
    servers.stop_all()


def key(server):
    return f"127.0.0.1:{server.port}"


def listed(proxy, role="decode"):
    return http_json("POST", proxy.url + "/instances/add", {"type": role, "instances": []})[1][
        f"current_{role}_instances"]


def slow_request(proxy, tokens, results):
    """A completion through the proxy in a thread; its (status, text) is appended to ``results``."""
    def run():
        status, _, raw = http("POST", proxy.url + "/v1/completions",
                              {"model": "dsv4", "prompt": "hello there", "max_tokens": tokens}, timeout=60)
        text = json.loads(raw)["choices"][0]["text"] if status == 200 and raw else ""
        results.append((status, text))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def busy_decode(decode):
    """The decode engine that has a request running (its /metrics), waiting for one to start."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for server in decode:
            if pd_drain.in_flight(http("GET", server.url + "/metrics")[2].decode()):
                return server
        time.sleep(0.02)
    raise AssertionError("no decode engine got the request")


def test_in_flight_reads_running_and_waiting_of_every_engine_label():
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\nvllm:num_requests_running{engine="1"} 1\n'
            'vllm:num_requests_running_total 9\n')
    assert pd_drain.in_flight(text) == 4
    assert pd_drain.in_flight("vllm:num_requests_running 0.0\n") == 0
    assert pd_drain.in_flight("up 1\n") is None and pd_drain.in_flight(None) is None


def test_an_idle_proxy_drops_the_rank_at_once_and_takes_it_back(pd):
    _, decode, proxy = pd
    out = pd_drain.drain(proxy.url, "decode", [key(decode[0])], timeout_s=10)
    assert out["drained"] and out["removed"] == [key(decode[0])] and out["isolated"] == []
    assert listed(proxy) == [key(decode[1])]
    back = pd_drain.restore(proxy.url, "decode", [key(decode[0])], [], timeout_s=10, interval_s=0.1)
    assert back["restored"] and back["missing"] == [] and key(decode[0]) in listed(proxy)


def test_a_rank_with_a_request_in_flight_is_isolated_until_the_request_ends(pd):
    _, decode, proxy = pd
    results = []
    thread = slow_request(proxy, 20, results)
    busy = busy_decode(decode)
    t0 = time.monotonic()
    out = pd_drain.drain(proxy.url, "decode", [key(busy)], timeout_s=30, interval_s=0.1)
    waited = time.monotonic() - t0
    thread.join()
    # the drain lasted until the request was answered, and the request was answered in full
    assert out["drained"] and waited >= 0.5, out
    assert results == [(200, results[0][1])] and results[0][1]
    # requests sent during the drain went to the other decode engine
    other = next(s for s in decode if s is not busy)
    assert http("POST", proxy.url + "/v1/completions", {"model": "dsv4", "prompt": "x", "max_tokens": 2})[0] == 200
    assert pd_drain.in_flight(http("GET", busy.url + "/metrics")[2].decode()) == 0
    assert key(other) in listed(proxy)


def test_a_rank_left_isolated_is_removed_then_added_back_once_the_proxy_is_idle(pd):
    # upstream ignores an add for an instance still listed (isolated): without the removal first,
    # the rank would stay isolated and be dropped at the proxy's next idle moment
    _, decode, proxy = pd
    results = []
    thread = slow_request(proxy, 15, results)
    busy = busy_decode(decode)
    idle = next(s for s in decode if s is not busy)
    out = pd_drain.drain(proxy.url, "decode", [key(idle)], timeout_s=30, interval_s=0.1)
    assert out["drained"] and out["isolated"] == [key(idle)], out  # idle engine, busy proxy
    back = pd_drain.restore(proxy.url, "decode", [key(idle)], out["isolated"], timeout_s=30, interval_s=0.1)
    thread.join()
    assert back["restored"] and back["still_isolated"] == [], back
    assert sorted(listed(proxy)) == sorted([key(busy), key(idle)]) and results[0][0] == 200
    # and it is a full member again: two requests at once go one to each decode engine
    threads = [slow_request(proxy, 15, results)]
    first = busy_decode(decode)
    threads.append(slow_request(proxy, 15, results))
    second = busy_decode([s for s in decode if s is not first])
    for t in threads:
        t.join()
    assert {first.port, second.port} == {busy.port, idle.port}
    assert [r[0] for r in results] == [200, 200, 200]


def test_the_waits_are_bounded_and_report_a_proxy_that_does_not_answer():
    clock = FakeClock()
    calls = []

    def send(url, method, body, timeout):
        calls.append((method, url))
        return 0, b"", "ConnectionRefusedError: [Errno 111] Connection refused"

    out = pd_drain.drain("http://127.0.0.1:1", "decode", ["127.0.0.1:2"], timeout_s=5, interval_s=1,
                         clock=clock, sleep=clock.sleep, send=send)
    assert not out["drained"] and "Connection refused" in out["error"] and out["waited_s"] >= 5
    back = pd_drain.restore("http://127.0.0.1:1", "decode", ["127.0.0.1:2"], [], timeout_s=5, interval_s=1,
                            clock=clock, sleep=clock.sleep, send=send)
    assert not back["restored"] and back["missing"] == ["127.0.0.1:2"] and "Connection refused" in back["error"]
    assert all(url.startswith("http://127.0.0.1:") for _, url in calls)


def test_an_instance_type_the_proxy_refuses_is_an_error_not_a_drain():
    def send(url, method, body, timeout):
        return 200, json.dumps({"error": "Instance type 'x' is not supported."}).encode(), ""
    clock = FakeClock()
    out = pd_drain.drain("http://127.0.0.1:1", "x", ["127.0.0.1:2"], timeout_s=2, interval_s=1,
                         clock=clock, sleep=clock.sleep, send=send)
    assert not out["drained"] and "not supported" in out["error"]


def test_while_the_proxy_is_never_idle_an_isolated_rank_cannot_come_back_and_the_restore_says_so(pd):
    # vllm-ascend's proxy drops an isolated instance only when it has no request in flight at all,
    # and ignores an add for it until then: a restore under unbroken load ends on its bound, naming it
    _, decode, proxy = pd
    results = []
    thread = slow_request(proxy, 40, results)  # 4 s in flight
    busy = busy_decode(decode)
    idle = next(s for s in decode if s is not busy)
    out = pd_drain.drain(proxy.url, "decode", [key(idle)], timeout_s=30, interval_s=0.1)
    assert out["drained"] and out["isolated"] == [key(idle)]
    stuck = pd_drain.restore(proxy.url, "decode", [key(idle)], out["isolated"], timeout_s=1, interval_s=0.1)
    assert not stuck["restored"] and stuck["still_isolated"] == [key(idle)] and stuck["missing"] == [key(idle)]
    thread.join()
    back = pd_drain.restore(proxy.url, "decode", [key(idle)], stuck["still_isolated"], timeout_s=10, interval_s=0.1)
    assert back["restored"] and sorted(listed(proxy)) == sorted([key(busy), key(idle)])


def test_wire_adds_new_instances_and_drains_out_dropped_ones(pd, tmp_path):
    prefill, decode, proxy = pd
    assert pd_drain.listed_instances(proxy.url) == {"prefill": [key(prefill[0])],
                                                    "decode": sorted([key(decode[0]), key(decode[1])])}
    extra = Servers(tmp_path / "more")
    (tmp_path / "more").mkdir()
    try:
        third = extra.engine(*COMMON, "--kv-transfer-config", D_KTC, env=clean_env(PD_STANDIN_TOKEN_SECONDS=TOKEN_S))
        # scale out: the new decode engine is added once it answers
        want = {"prefill": [key(prefill[0])], "decode": [key(d) for d in (*decode, third)]}
        out = pd_drain.wire(proxy.url, want, timeout_s=10, interval_s=0.1)
        assert out["wired"] and out["added"] == {"decode": [key(third)]} and out["removed"] == {}
        assert sorted(listed(proxy)) == sorted(want["decode"])
        # scale in while a request runs on the dropped engine: it is drained, the request answered
        results = []
        thread = slow_request(proxy, 20, results)
        busy = busy_decode([*decode, third])
        want = {"prefill": [key(prefill[0])], "decode": [key(d) for d in (*decode, third) if d is not busy]}
        out = pd_drain.wire(proxy.url, want, timeout_s=30, interval_s=0.1)
        thread.join()
        assert out["wired"] and out["removed"] == {"decode": [key(busy)]} and results[0][0] == 200
        assert pd_drain.in_flight(http("GET", busy.url + "/metrics")[2].decode()) == 0
        # wired as wanted: nothing to do
        again = pd_drain.wire(proxy.url, want, timeout_s=5, interval_s=0.1)
        assert again["wired"] and again["added"] == {} and again["removed"] == {}
    finally:
        extra.stop_all()
    assert "error" in pd_drain.listed_instances("http://127.0.0.1:1", timeout=1)


def test_a_proxy_that_is_down_is_named_as_such():
    """Issue 20: with the proxy container killed mid-deploy the message blamed the new ranks."""
    calls = []

    def refused(url, method, body, timeout):
        calls.append(url)
        return 0, b"", "ConnectionRefusedError: [Errno 111] Connection refused"

    def answers(url, method, body, timeout):
        return 200, json.dumps({"current_prefill_instances": []}).encode(), ""

    exited = {"pd-c-proxy": "container exited (exit code 137)"}
    gone = exited.get
    # Docker says why: its container is named with Docker's words, the proxy is not even asked
    assert pd_drain.proxy_down("http://127.0.0.1:1", "pd-c-proxy", "/s", send=refused,
                               gone=lambda sock, name: gone(name)) == \
        "its container pd-c-proxy: container exited (exit code 137)"
    assert calls == []
    # the container runs (or Docker cannot say) but nothing answers
    down = pd_drain.proxy_down("http://127.0.0.1:1", "pd-c-other", "/s", send=refused,
                               gone=lambda sock, name: gone(name))
    assert down.startswith("it does not answer on http://127.0.0.1:1 (ConnectionRefused")
    # a proxy that answers is up, whatever its wiring: the ranks are the question then
    assert pd_drain.proxy_down("http://127.0.0.1:1", "pd-c-other", "/s", send=answers,
                               gone=lambda sock, name: None) == ""
    assert all(url.startswith("http://127.0.0.1:") for url in calls)


def test_a_proxy_with_nothing_listening_is_down_for_real():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        url = f"http://127.0.0.1:{port}"
        out = pd_drain.wire(url, {"prefill": [], "decode": ["127.0.0.1:2"]}, timeout_s=1, interval_s=0.1)
        assert not out["wired"] and out["error"]
        assert pd_drain.proxy_down(url).startswith(f"it does not answer on {url}")
