"""The Molecule load generator (molecule/shared/files/load.py) against the stand-in proxy and engines:
overlapping clients never let the proxy idle, a load with pauses is seen idling, failures and the
backends that served are counted (issue 20 item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from tests.fixtures.standin_procs import REPO, clean_env

LOAD = REPO / "molecule" / "shared" / "files" / "load.py"
COMMON = ("--served-model-name", "deepseek-v4-flash", "--max-model-len", "8192")
TOKEN_S = "0.05"


@pytest.fixture
def pd(servers):
    env = clean_env(PD_STANDIN_TOKEN_SECONDS=TOKEN_S)
    prefill = [servers.engine(*COMMON, env=env)]
    decode = [servers.engine(*COMMON, env=env) for _ in range(2)]
    proxy = servers.proxy(prefill, decode, "--waiting-retry-interval", "0.2")
    return prefill, decode, proxy


def run_load(tmp_path, url, *flags, stop_after=3.0, limit=60):
    """Run load.py, create its stop file after `stop_after` s, return its JSON."""
    out, stop = tmp_path / "load.json", tmp_path / "load.stop"
    timer = threading.Timer(stop_after, stop.touch)
    timer.start()
    try:
        proc = subprocess.run([sys.executable, str(LOAD), url, str(out), str(stop), *flags],
                              capture_output=True, text=True, timeout=limit, check=False)
    finally:
        timer.cancel()
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def backends(*servers):
    return [arg for s in servers for arg in ("--backend", f"127.0.0.1:{s.port}")]


def test_overlapping_clients_never_let_the_proxy_idle_and_every_backend_serves(tmp_path, pd):
    prefill, decode, proxy = pd
    res = run_load(tmp_path, proxy.url, "--clients", "4", "--max-tokens", "12", "--spread-tokens", "6",
                   "--settle-s", "10", *backends(*prefill, *decode))
    assert res["failed"] == 0, res
    assert res["ok"] >= 8, res
    assert res["gaps"] == 0 and res["min_in_flight"] >= 1, res
    assert res["proxy_samples"] >= 5 and res["proxy_idle_samples"] == 0, res
    assert res["proxy_min_request_num"] >= 1, res
    assert res["unserved_after_stop"] == [], res
    assert all(res["served"][f"127.0.0.1:{s.port}"] > 0 for s in (*prefill, *decode)), res


def test_one_client_with_pauses_is_seen_idling(tmp_path, pd):
    """The measure can fail: the old load (pauses between requests) leaves the proxy idle."""
    _, _, proxy = pd
    res = run_load(tmp_path, proxy.url, "--clients", "1", "--pause-s", "0.3", "--max-tokens", "4")
    assert res["failed"] == 0, res
    assert res["gaps"] >= 2 and res["min_in_flight"] == 0, res
    assert res["proxy_idle_samples"] >= 1 and res["proxy_min_request_num"] == 0, res


def test_a_backend_the_proxy_does_not_use_is_reported_unserved(tmp_path, servers, pd):
    _, decode, proxy = pd
    outside = servers.engine(*COMMON, env=clean_env(PD_STANDIN_TOKEN_SECONDS=TOKEN_S))
    t0 = time.monotonic()
    res = run_load(tmp_path, proxy.url, "--clients", "3", "--max-tokens", "6", "--spread-tokens", "3",
                   "--settle-s", "2", *backends(decode[0], outside), stop_after=1.5)
    assert res["unserved_after_stop"] == [f"127.0.0.1:{outside.port}"], res
    assert res["served"][f"127.0.0.1:{outside.port}"] == 0, res
    assert res["settle_s"] >= 2, res
    assert time.monotonic() - t0 < 30


def test_failed_requests_are_counted_with_their_time(tmp_path, servers):
    env = clean_env(PD_STANDIN_TOKEN_SECONDS=TOKEN_S)
    prefill = servers.engine(*COMMON, env=env)
    decode = servers.engine(*COMMON, env=env)
    proxy = servers.proxy([prefill], [decode], "--waiting-retry-interval", "0.2")
    prefill.stop()  # the proxy cannot prefill: every request fails
    res = run_load(tmp_path, proxy.url, "--clients", "2", stop_after=1.0)
    assert res["ok"] == 0 and res["failed"] >= 2, res
    assert res["failures"][0]["status"] == 500 and res["first_failure_s"] is not None, res


@pytest.mark.parametrize("url,extra", [("http://10.0.0.1:24000", []),
                                       ("http://127.0.0.1:24000", ["--backend", "172.17.0.2:24200"])])
def test_only_loopback_is_contacted(tmp_path, url, extra):
    proc = subprocess.run([sys.executable, str(LOAD), url, str(tmp_path / "o"), str(tmp_path / "s"), *extra],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode != 0 and "127.0.0.1 only" in proc.stderr
