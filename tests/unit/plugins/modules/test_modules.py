"""The pd_host_probe and pd_http_wait modules and their shared HTTP helpers (plugins/module_utils/pd_http.py).

HTTP goes to servers these tests start on 127.0.0.1 and to a fake Docker Engine API on a unix socket
in a temporary directory; nothing else is contacted.
"""

import http.server
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from ansible_collections.pd.deploy.plugins.module_utils import pd_http
from tests.fixtures.fake_clock import FakeClock
from tests.fixtures.unix_http import QuietHandler, serving


def load(name):
    """plugins/modules/<name>.py, imported under the collection's name."""
    return importlib.import_module(f"ansible_collections.pd.deploy.plugins.modules.{name}")


probe_mod = load("pd_host_probe")


# ---- servers ------------------------------------------------------------------------------------

class Engine(http.server.BaseHTTPRequestHandler):
    """/health answers 200 after `ready_after` requests; /sick 503; POST /echo returns the body."""
    hits = {}
    ready_after = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        Engine.hits[self.path] = Engine.hits.get(self.path, 0) + 1
        if self.path == "/health" and Engine.hits[self.path] > Engine.ready_after:
            self._send(200, b"")
        else:
            self._send(503, b"starting")

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200, body)

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    Engine.hits = {}
    Engine.ready_after = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


OLD_IMAGE, NEW_IMAGE = "sha256:" + "a" * 64, "sha256:" + "b" * 64
CONTAINERS = [
    # as dockerd lists them: Image is the reference it was created with, ImageID the image it runs
    {"Names": ["/pd-c-decode0-dp0"], "State": "running", "Image": "registry.local/vllm-ascend:v0.25.1",
     "ImageID": OLD_IMAGE, "Labels": {"pd.spec-hash": "h0", "pd.managed-by": "pd-deploy", "pd.image-id": OLD_IMAGE,
                                      "pd.image-digest": "registry.local/vllm-ascend@sha256:" + "c" * 64}},
    {"Names": ["/pd-c-decode0-dp1"], "State": "exited", "Labels": {"pd.spec-hash": "h1", "pd.managed-by": "pd-deploy"}},
    {"Names": ["/pd-c-decode0-dp1-previous"], "State": "exited", "Labels": {"pd.spec-hash": "h-old"}},
]


class FakeDocker(QuietHandler):
    """The few Engine API calls the probe makes, answered like dockerd does."""
    requests = []

    def do_GET(self):  # noqa: N802
        FakeDocker.requests.append(self.path)
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/containers/json":
            query = urllib.parse.parse_qs(url.query)
            assert query["all"] == ["1"]
            assert json.loads(query["filters"][0]) == {"label": ["pd.managed-by=pd-deploy"]}
            self._send(200, json.dumps(CONTAINERS).encode())
        elif url.path == "/images/registry.local/vllm-ascend:v0.25.1/json":
            # the tag was rebuilt: it names another image than the one dp0 runs
            self._send(200, json.dumps({"Id": NEW_IMAGE, "RepoDigests": ["registry.local/vllm-ascend@sha256:" + "d" * 64]}).encode())
        elif url.path == "/images/local/built:1/json":
            self._send(200, json.dumps({"Id": OLD_IMAGE, "RepoDigests": None}).encode())
        else:
            self._send(404, b'{"message": "No such image"}')

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def docker_socket(tmp_path):
    FakeDocker.requests = []
    with serving(str(tmp_path / "docker.sock"), FakeDocker) as path:
        yield path


# ---- pd_http ------------------------------------------------------------------------------------

def test_request_reads_status_and_body(engine):
    assert pd_http.request(f"{engine}/health")[:2] == (200, b"")
    assert pd_http.request(f"{engine}/sick")[:2] == (503, b"starting")
    status, body, error = pd_http.request(f"{engine}/echo", "POST", {"prompt": "x"})
    assert (status, json.loads(body), error) == (200, {"prompt": "x"}, "")


def test_request_to_a_closed_port_reports_the_error_not_raises():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status, _, error = pd_http.request(f"http://127.0.0.1:{port}/health", timeout=1)
    assert status == 0 and "ConnectionRefusedError" in error


def test_request_ignores_http_proxy_settings(engine, monkeypatch):
    # a proxy variable on the host must not reroute a loopback probe
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert pd_http.request(f"{engine}/health")[0] == 200


@pytest.mark.parametrize("url", ["https://127.0.0.1/health", "127.0.0.1:8200/health", ""])
def test_request_refuses_what_is_not_plain_http(url):
    status, _, error = pd_http.request(url)
    assert status == 0 and "not an http:// URL" in error


def test_wait_all_polls_every_check_in_the_same_rounds_until_each_deadline():
    clock = FakeClock()
    answers = {"a": [0, 0, 200], "b": [503] * 100}
    sent = []

    def send(url, method, body, timeout):
        sent.append(url)
        # before b's 5 s deadline a request to b is cut to the time left; the last attempt, made
        # after the final interval, gets a whole request timeout
        assert 0.5 <= timeout <= 5.0
        if url == "b" and clock.now < 5:
            assert timeout <= max(0.5, 5 - clock.now)
        clock.now += 0.1
        queue = answers[url]
        return (queue.pop(0) if len(queue) > 1 else queue[0]), b"", ""

    checks = [{"name": "ra", "url": "a", "timeout_s": 30}, {"name": "rb", "url": "b", "timeout_s": 5}]
    results = pd_http.wait_all(checks, 2, clock=clock, sleep=clock.sleep, send=send)
    # a and b alternate while both are pending: one round probes every pending check
    assert sent[:6] == ["a", "b", "a", "b", "a", "b"]
    assert results[0]["ok"] and results[0]["attempts"] == 3 and results[0]["error"] == ""
    assert not results[1]["ok"] and results[1]["status"] == 503 and results[1]["error"] == "HTTP 503"
    # b kept being probed until its own 5 s deadline, not a's
    assert 5 <= results[1]["waited_s"] < 7.5


def test_wait_all_with_zero_timeout_probes_once():
    calls = []

    def send(url, method, body, timeout):
        calls.append((url, method, body, timeout))
        return 0, b"", "ConnectionRefusedError: [Errno 111] Connection refused"

    results = pd_http.wait_all([{"name": "x", "url": "u", "timeout_s": 0, "method": "POST", "body": {"k": 1}}],
                               1, request_timeout=4.0, sleep=lambda s: None, send=send)
    # one attempt, with the whole request timeout (no deadline left to cut it to)
    assert calls == [("u", "POST", {"k": 1}, 4.0)]
    assert results[0]["error"].startswith("ConnectionRefusedError") and not results[0]["ok"]


def test_wait_all_stops_waiting_for_a_check_whose_container_exited():
    clock = FakeClock()
    asked = []

    def send(url, method, body, timeout):
        clock.now += 0.1
        return 0, b"", "ConnectionRefusedError: [Errno 111] Connection refused"

    def gone(name):
        asked.append(name)
        # "dead" exits on its third probe; "slow" keeps running (it has no container named: never asked)
        return "container exited (exit code 2)" if name == "dead" and len(asked) >= 3 else None

    checks = [{"name": "d", "url": "d", "timeout_s": 600, "container": "dead"},
              {"name": "s", "url": "s", "timeout_s": 20}]
    results = pd_http.wait_all(checks, 5, clock=clock, sleep=clock.sleep, send=send, gone=gone)
    assert asked == ["dead"] * 3
    assert results[0] == {"name": "d", "url": "d", "ok": False, "status": 0, "error": "container exited (exit code 2)",
                          "exited": True, "attempts": 3, "waited_s": results[0]["waited_s"]}
    assert results[0]["waited_s"] < 15  # not its 600 s deadline
    assert not results[1]["ok"] and results[1]["waited_s"] >= 20 and "exited" not in results[1]


def test_container_gone_reads_the_state_from_the_docker_api(monkeypatch):
    answers = {
        "/containers/run/json": (200, {"State": {"Status": "running", "Running": True}}, ""),
        "/containers/loop/json": (200, {"State": {"Status": "restarting", "Restarting": True, "ExitCode": 1},
                                        "RestartCount": 2}, ""),
        "/containers/back/json": (200, {"State": {"Status": "running", "ExitCode": 0}, "RestartCount": 1}, ""),
        "/containers/out/json": (200, {"State": {"Status": "exited", "ExitCode": 2}}, ""),
        "/containers/none/json": (404, {"message": "No such container: none"}, ""),
        "/containers/down/json": (0, None, "cannot reach the Docker engine"),
    }
    monkeypatch.setattr(pd_http, "docker", lambda sock, method, path: answers[path])
    assert pd_http.container_gone("/s", "run") is None
    # a crash loop, caught while Docker restarts it or after it came back
    assert pd_http.container_gone("/s", "loop") == ("container is crash-looping (exit code 1, restarted 2 time(s) "
                                                    "by its restart policy)")
    assert pd_http.container_gone("/s", "back").startswith("container is crash-looping")
    assert pd_http.container_gone("/s", "out") == "container exited (exit code 2)"
    assert pd_http.container_gone("/s", "none") == "container does not exist"
    assert pd_http.container_gone("/s", "down") is None


def test_wait_all_against_an_engine_that_becomes_ready(engine):
    Engine.ready_after = 2
    results = pd_http.wait_all([{"name": "r", "url": f"{engine}/health", "timeout_s": 10}], 0.05)
    assert results[0]["ok"] and results[0]["attempts"] == 3 and results[0]["status"] == 200


def test_docker_api_over_the_unix_socket(docker_socket):
    status, body, error = pd_http.docker(docker_socket, "GET", "/images/nope/json")
    assert (status, body, error) == (404, {"message": "No such image"}, "")


def test_docker_api_without_an_engine_says_where_it_looked(tmp_path):
    status, body, error = pd_http.docker(str(tmp_path / "missing.sock"), "GET", "/containers/json")
    assert status == 0 and body is None
    assert error.startswith(f"cannot reach the Docker engine at unix://{tmp_path}/missing.sock")


# ---- pd_host_probe ------------------------------------------------------------------------------

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:2008 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:2008 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:7594 00000000000000000000000000000000:0000 0A 00000000:00000000
   1: 00000000000000000000000001000000:0019 00000000000000000000000000000000:0000 0A 00000000:00000000
"""


def test_listening_ports_come_from_listen_rows_of_tcp_and_tcp6():
    # 0x16=22, 0x2008=8200 (the established row on 8200 is not a listener), 0x7594=30100, 0x19=25
    assert probe_mod.listening_ports(PROC_NET_TCP, PROC_NET_TCP6) == [22, 25, 8200, 30100]
    assert probe_mod.listening_ports("", None) == []


def test_listening_ports_of_this_machine_include_a_socket_we_open():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = probe_mod.listening_ports(probe_mod.read_text("/proc/net/tcp"), probe_mod.read_text("/proc/net/tcp6"))
    assert port in found


def test_stat_paths_tell_directories_character_devices_and_missing(tmp_path):
    (tmp_path / "file").write_text("x")
    stats = probe_mod.stat_paths([str(tmp_path), str(tmp_path / "file"), "/dev/null", str(tmp_path / "nope")])
    assert stats[str(tmp_path)] == {"exists": True, "isdir": True, "ischr": False}
    assert stats[str(tmp_path / "file")] == {"exists": True, "isdir": False, "ischr": False}
    assert stats["/dev/null"] == {"exists": True, "isdir": False, "ischr": True}
    assert stats[str(tmp_path / "nope")] == {"exists": False, "isdir": False, "ischr": False}


def test_disk_free_is_the_space_left_to_unprivileged_users(tmp_path):
    # shutil.disk_usage is Python's own reading of the same filesystem, as df reports "Available"
    assert probe_mod.disk_free(str(tmp_path)) == shutil.disk_usage(tmp_path).free
    assert probe_mod.disk_free(str(tmp_path / "nope")) is None


def test_containers_and_images_from_the_docker_api(docker_socket):
    ok, msg, found = probe_mod.list_containers(docker_socket, "pd.managed-by=pd-deploy")
    rest = {"cluster": "", "host": "", "baseline": False}  # the fake API's containers carry no such labels
    none = {"image_id": "", "image_labels": {}}
    assert ok and msg == ""
    assert found == [
        {"name": "pd-c-decode0-dp0", "state": "running", "running": True, "hash": "h0", **rest,
         "image_id": OLD_IMAGE, "image_labels": {"pd.image-id": OLD_IMAGE,
                                                 "pd.image-digest": "registry.local/vllm-ascend@sha256:" + "c" * 64}},
        {"name": "pd-c-decode0-dp1", "state": "exited", "running": False, "hash": "h1", **rest, **none},
        {"name": "pd-c-decode0-dp1-previous", "state": "exited", "running": False, "hash": "h-old", **rest, **none},
    ]
    missing = probe_mod.missing_images(docker_socket, ["registry.local/vllm-ascend:v0.25.1", "other:1"])
    assert missing == ["other:1"]


def test_image_references_resolve_to_the_id_and_repo_digests_the_engine_reports(docker_socket):
    refs = ["registry.local/vllm-ascend:v0.25.1", "local/built:1", "other:1", "local/built:1"]
    assert probe_mod.resolve_images(docker_socket, refs) == {
        "registry.local/vllm-ascend:v0.25.1": {"id": NEW_IMAGE,
                                               "repo_digests": ["registry.local/vllm-ascend@sha256:" + "d" * 64]},
        "local/built:1": {"id": OLD_IMAGE, "repo_digests": []},  # built or loaded: no repo digest
    }
    # one inspect per reference, repeated or not
    assert sum(r.startswith("/images/local/built:1/") for r in FakeDocker.requests) == 1


def test_containers_without_an_engine(tmp_path):
    ok, msg, found = probe_mod.list_containers(str(tmp_path / "none.sock"), "pd.managed-by=pd-deploy")
    assert not ok and "cannot reach the Docker engine" in msg and found == []


def test_only_containers_running_their_current_hash_are_probed():
    observed = [{"name": "a", "running": True, "hash": "h"}, {"name": "b", "running": True, "hash": "old"},
                {"name": "c", "running": False, "hash": "h"}]
    specs = [{"name": n, "hash": "h", "health_url": f"http://127.0.0.1:1/{n}"} for n in "abcd"]
    assert probe_mod.current_checks(specs, observed, 7) == [
        {"name": "a", "url": "http://127.0.0.1:1/a", "timeout_s": 7}]


# ---- the modules as Ansible runs them -----------------------------------------------------------

def ansible_module(name, args):
    """Run a module on localhost with the repository's ansible.cfg; return its JSON result."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local",
                           "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", "-m", f"pd.deploy.{name}", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.mark.ansible
def test_pd_host_probe_runs_as_a_module(docker_socket, engine, tmp_path):
    npu_smi = tmp_path / "npu-smi"
    npu_smi.write_text("#!/bin/sh\necho '\tTotal Count : 8'\n")
    npu_smi.chmod(0o755)
    result = ansible_module("pd_host_probe", {
        "docker_socket": docker_socket, "paths": ["/dev/null", str(tmp_path / "nope")], "npu_smi": str(npu_smi),
        "host_facts": True, "disk_path": str(tmp_path), "images": ["other:1"],
        "containers": [{"name": "pd-c-decode0-dp0", "hash": "h0", "health_url": f"{engine}/health",
                        "image": "registry.local/vllm-ascend:v0.25.1"},
                       {"name": "pd-c-decode0-dp1", "hash": "h1", "health_url": f"{engine}/sick"}],
    })
    assert result["changed"] is False and not result.get("failed")
    assert result["stats"]["/dev/null"]["ischr"] and not result["stats"][str(tmp_path / "nope")]["exists"]
    assert result["npu_smi"]["rc"] == 0 and "Total Count : 8" in result["npu_smi"]["stdout"]
    assert "MemTotal" in result["meminfo"] and result["disk_free_bytes"] > 0
    assert result["docker"] == {"ok": True, "msg": ""} and result["images_missing"] == ["other:1"]
    # dp0 runs h0 and is probed; dp1 is stopped, so not probed
    assert [h["name"] for h in result["health"]] == ["pd-c-decode0-dp0"] and result["health"][0]["ok"]
    # what dp0 runs and what its tag names now: the controller compares them (plugin_utils.containers)
    assert result["containers"][0]["image_id"] == OLD_IMAGE
    assert result["image_refs"]["registry.local/vllm-ascend:v0.25.1"]["id"] == NEW_IMAGE
    assert "other:1" not in result["image_refs"]


@pytest.mark.ansible
def test_pd_host_probe_without_npu_smi_or_docker_reports_instead_of_failing(tmp_path):
    result = ansible_module("pd_host_probe", {"docker_socket": str(tmp_path / "none.sock"),
                                              "npu_smi": str(tmp_path / "npu-smi"), "images": ["x:1"]})
    assert not result.get("failed")
    assert result["images_missing"] == []  # not looked up: the Docker message says why
    assert result["npu_smi"]["rc"] == 127 and "No such file" in result["npu_smi"]["stderr"]
    assert result["docker"]["ok"] is False and result["containers"] == []


@pytest.mark.ansible
def test_pd_http_wait_runs_as_a_module(engine):
    result = ansible_module("pd_http_wait", {"interval": 0.2, "checks": [
        {"name": "up", "url": f"{engine}/health", "timeout_s": 5},
        {"name": "down", "url": f"{engine}/sick", "timeout_s": 1}]})
    assert not result.get("failed") and result["all_ok"] is False
    assert [(r["name"], r["ok"]) for r in result["results"]] == [("up", True), ("down", False)]
    assert result["results"][1]["status"] == 503


def test_the_wait_removes_the_retire_container_of_each_check_that_answered():
    """wait.yml: a replaced rank's <name>-previous goes in the wait's own run once the rank answered."""
    from ansible_collections.pd.deploy.plugins.modules import pd_http_wait
    checks = [{"name": "a", "retire": "a-previous"}, {"name": "b", "retire": "b-previous"}, {"name": "c"}]
    results = [{"name": "a", "ok": True}, {"name": "b", "ok": False}, {"name": "c", "ok": True}]
    removed = []
    assert pd_http_wait.retire("/s", checks, results, remove=lambda _s, name: removed.append(name) or "") == []
    # the one that did not answer keeps its previous container: the rollback starts it again
    assert removed == ["a-previous"] and results[0]["retired"] == "a-previous"
    assert "retired" not in results[1] and "retired" not in results[2]
    refused = pd_http_wait.retire("/s", checks[:1], [{"name": "a", "ok": True}],
                                  remove=lambda _s, name: f"cannot remove {name}: Docker API answered HTTP 500")
    assert refused == ["a answered, but cannot remove a-previous: Docker API answered HTTP 500"]


@pytest.mark.ansible
def test_pd_http_wait_refuses_a_check_without_url():
    result = ansible_module("pd_http_wait", {"checks": [{"name": "x", "timeout_s": 5}]})
    assert result["failed"] and "checks[0] lacks url" in result["msg"]


@pytest.mark.ansible
@pytest.mark.parametrize("conf, chips, name, hbm_mb", [
    ("", 8, "910B3", 65536),                                                           # A2 default
    ("PD_FAKE_NPU_NAME=910B4\nPD_FAKE_HBM_MB=32768\n", 8, "910B4", 32768),            # a 32 GB 910B4
    ("PD_FAKE_NPUS=16\nPD_FAKE_CHIPS_PER_NPU=2\nPD_FAKE_NPU_NAME=Ascend910\n", 16, "Ascend910", 65536),  # A3
])
def test_pd_host_probe_reads_the_npu_table_the_prechecks_judge(tmp_path, conf, chips, name, hbm_mb):
    """The probe runs `npu-smi info -l` and `npu-smi info`; the prechecks read count, chip and HBM."""
    from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import prechecks

    fake = tmp_path / "npu-smi"
    shutil.copy(REPO / "tests" / "fixtures" / "ascend" / "npu-smi", fake)
    fake.chmod(0o755)
    (tmp_path / "npu-smi.fake.conf").write_text(conf)
    result = ansible_module("pd_host_probe", {"docker_socket": str(tmp_path / "none.sock"), "npu_smi": str(fake)})
    assert result["npu_smi_info"]["rc"] == 0
    assert prechecks.npu_count(result["npu_smi"]["stdout"]) == chips
    table = prechecks.npu_table(result["npu_smi_info"]["stdout"])
    assert [(row["name"], row["hbm_mb"]) for row in table] == [(name, hbm_mb)] * chips
    assert prechecks.npu_model_problems(table, name, hbm_mb * 1024 ** 2) == []


@pytest.mark.ansible
def test_pd_host_probe_runs_its_two_npu_smi_calls_at_the_same_time(tmp_path):
    """npu-smi takes about a second a call on a real host: `info -l` and `info` overlap, not add up."""
    fake = tmp_path / "npu-smi"
    log = tmp_path / "calls"
    # each call records when it began and ended (monotonic clock of the same machine)
    fake.write_text("#!/usr/bin/env python3\nimport sys, time\n"
                    f"start = time.monotonic(); time.sleep(1.0)\n"
                    f"open({str(log)!r}, 'a').write(f'{{start}} {{time.monotonic()}}\\n')\n"
                    "print('ok')\n")
    fake.chmod(0o755)
    result = ansible_module("pd_host_probe", {"docker_socket": str(tmp_path / "none.sock"), "npu_smi": str(fake)})
    assert result["npu_smi"]["rc"] == 0 and result["npu_smi_info"]["rc"] == 0
    (a0, a1), (b0, b1) = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    # the second call began before the first ended
    assert max(a0, b0) < min(a1, b1)


@pytest.mark.ansible
def test_pd_host_probe_runs_no_npu_smi_on_a_settled_host(docker_socket, engine, tmp_path):
    """Every container of the host runs its launch spec (the no-op re-run): npu-smi, a second a call on
    a real host, is not run; a host that starts a rank runs it."""
    fake = tmp_path / "npu-smi"
    log = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho called >> {log}\necho '\tTotal Count : 8'\n")
    fake.chmod(0o755)
    running = {"name": "pd-c-decode0-dp0", "hash": "h0", "health_url": f"{engine}/health"}
    settled = ansible_module("pd_host_probe", {"docker_socket": docker_socket, "npu_smi": str(fake),
                                               "containers": [running]})
    assert settled["skipped_checks"] and settled["npu_smi"] is None and settled["npu_smi_info"] is None
    assert not log.exists()
    starting = ansible_module("pd_host_probe", {"docker_socket": docker_socket, "npu_smi": str(fake),
                                                "containers": [running, {"name": "pd-c-decode0-dp1", "hash": "new"}]})
    assert not starting["skipped_checks"] and starting["npu_smi"]["rc"] == 0
    assert log.read_text().count("called") == 2


def test_container_logs_read_every_name_in_one_run(monkeypatch):
    logs_mod = load("pd_container_logs")
    body = bytes([1, 0, 0, 0, 0, 0, 0, 6]) + b"hello\n"
    seen = []

    def raw(sock, path):
        seen.append(path)
        if path.startswith("/containers/a/logs?"):
            return 200, body, ""
        if path.startswith("/containers/gone/logs?"):
            return 404, b'{"message":"No such container: gone"}', ""
        return 0, b"", "cannot reach the Docker engine at unix:///s: refused"

    monkeypatch.setattr(logs_mod, "docker_raw", raw)
    out = logs_mod.read_logs("/s", ["a", "gone", "down"], "40")
    assert seen[0] == "/containers/a/logs?stdout=1&stderr=1&tail=40"
    assert [e["status"] for e in out] == [200, 404, 0]
    assert out[1]["error"] == "Docker API answered HTTP 404" and "content" not in out[1]
    # the controller's filter de-frames the bodies and leaves out what could not be read
    from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
    assert containers.docker_logs(out) == {"a": "hello\n"}


@pytest.mark.ansible
def test_container_logs_gives_back_only_this_runs_locks_after_the_read(tmp_path):
    mine, other, gone = tmp_path / "a.lock", tmp_path / "b.lock", tmp_path / "c.lock"
    mine.write_text(json.dumps({"run_id": "ctl:10:99"}))
    other.write_text(json.dumps({"run_id": "ctl:11:99"}))
    args = {"names": ["x"], "tail": "5", "docker_socket": str(tmp_path / "none.sock"),
            "release_locks": [str(mine), str(other), str(gone)]}
    # without the run id nothing is given back: the module names the missing option
    refused = ansible_module("pd_container_logs", args)
    assert refused["failed"] and "lock_run_id" in refused["msg"] and mine.exists()
    out = ansible_module("pd_container_logs", dict(args, lock_run_id="ctl:10:99"))
    assert out["released"] == [str(mine)] and out["changed"] and not mine.exists() and other.exists()
    assert out["logs"][0]["status"] == 0 and out["logs"][0]["error"]  # the read is still reported
    # a read without locks to give back changes nothing
    assert ansible_module("pd_container_logs", {"names": ["x"], "docker_socket": str(tmp_path / "none.sock")}) \
        ["released"] == []


def test_docker_raw_returns_the_body_as_sent(docker_socket):
    status, body, error = pd_http.docker_raw(docker_socket, "/images/nope/json")
    assert (status, json.loads(body), error) == (404, {"message": "No such image"}, "")


def test_pauses_start_short_and_double_up_to_the_interval():
    gaps = pd_http.pauses(5)
    assert [next(gaps) for _ in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    # an interval below the first pause is kept from the start
    gaps = pd_http.pauses(0.1)
    assert [next(gaps) for _ in range(3)] == [0.1, 0.1, 0.1]


def test_wait_all_answers_soon_after_a_check_that_is_ready_within_a_second():
    # a proxy that answers 0.6 s after the wait began: the wait ends then, not at the 5 s interval
    clock = FakeClock()

    def send(url, method, body, timeout):
        return (200 if clock.now >= 0.6 else 0), b"", ""

    results = pd_http.wait_all([{"name": "p", "url": "p", "timeout_s": 60}], 5, clock=clock, sleep=clock.sleep,
                               send=send)
    assert results[0]["ok"] and results[0]["attempts"] == 3 and results[0]["waited_s"] < 1.0
    # with first_interval = interval the rounds are even (the old behaviour): the second probe only at 5 s
    clock.now = 0
    results = pd_http.wait_all([{"name": "p", "url": "p", "timeout_s": 60}], 5, clock=clock, sleep=clock.sleep,
                               send=send, first_interval=5)
    assert results[0]["ok"] and results[0]["attempts"] == 2 and results[0]["waited_s"] >= 5


def test_wait_all_checks_a_json_list_and_sends_the_check_headers():
    # the smoke requests: one try each (timeout_s 0), the answer must hold choices, the key goes along
    answers = {"/ok": (200, b'{"choices": [{"text": "x"}]}', ""), "/empty": (200, b'{"choices": []}', ""),
               "/html": (200, b"<html>", ""), "/bad": (400, b'{"error": "no chat template"}', "")}
    sent = []

    def send(url, method, body, timeout, headers=None):
        sent.append((url, method, headers, timeout))
        return answers[url]

    checks = [{"name": n, "url": n, "timeout_s": 0, "method": "POST", "body": {}, "json_list": "choices",
               "headers": {"Authorization": "Bearer k"}} for n in answers]
    results = pd_http.wait_all(checks, 5, request_timeout=120, sleep=lambda s: None, send=send)
    assert [r["ok"] for r in results] == [True, False, False, False]
    assert [r["attempts"] for r in results] == [1, 1, 1, 1]
    assert results[1]["error"] == "the answer has no choices" and results[1]["answer"] == '{"choices": []}'
    assert results[2]["error"] == "the answer is not JSON, so it has no choices"
    assert results[3]["error"] == "HTTP 400" and "no chat template" in results[3]["answer"]
    assert "answer" not in results[0]
    assert all(h == {"Authorization": "Bearer k"} and t == 120 for _, _, h, t in sent)


def test_request_sends_the_extra_headers(engine):
    seen = {}

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            seen["auth"] = self.headers.get("Authorization")
            seen["host"] = self.headers.get("Host")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, _, _ = pd_http.request(f"http://127.0.0.1:{server.server_port}/v1/completions", "POST", {"a": 1},
                                       headers={"Authorization": "Bearer k"})
    finally:
        server.shutdown()
    assert status == 200 and seen == {"auth": "Bearer k", "host": "localhost"}


def test_failed_summary_names_each_check_that_did_not_answer():
    results = [{"name": "/v1/completions", "ok": True},
               {"name": "/v1/chat/completions", "ok": False, "error": "HTTP 400", "answer": '{"error": "no template"}'},
               {"name": "r", "ok": False, "error": ""}]
    assert pd_http.failed_summary(results) == (
        '2 of 3 did not answer as expected: /v1/chat/completions (HTTP 400: {"error": "no template"}); r (no answer)')
    assert pd_http.failed_summary(results[:1]) == ""


# ---- the probe's tool runner --------------------------------------------------------------------

def test_tool_runner_reads_what_a_slow_tool_prints_as_it_exits(tmp_path):
    """npu-smi takes about a second and prints its table as it exits. AnsibleModule.run_command can
    drop that output (ansible/ansible issue 51393: select times out, the child exits, the loop stops
    without reading); the probe's runner reads to the end: the whole table, every time."""
    tool = tmp_path / "slow-tool"
    tool.write_text("#!/bin/sh\nsleep 1.2\nfor i in 1 2 3 4 5 6 7 8; do echo \"| $i 910B3 | OK |\"; done\n"
                    "echo warn >&2\nexit 3\n")
    tool.chmod(0o755)
    rc, out, err = probe_mod.ToolRunner().run_command([tool, "info"])
    assert (rc, out.count("910B3"), err) == (3, 8, "warn\n")
    assert probe_mod.run_npu_smi(probe_mod.ToolRunner(), str(tool))["stdout"] == out
    with pytest.raises(OSError):  # what run_npu_smi and run_hccn turn into rc 127
        probe_mod.ToolRunner().run_command([tmp_path / "missing"])
    assert probe_mod.run_npu_smi(probe_mod.ToolRunner(), str(tmp_path / "missing"))["rc"] == 127


def test_the_probe_runs_its_tools_with_its_own_runner():
    """main() hands npu-smi and hccn_tool the ToolRunner, not the AnsibleModule (whose run_command
    loses late output)."""
    source = (REPO / "plugins" / "modules" / "pd_host_probe.py").read_text()
    main = source[source.index("def main("):]
    assert "run_npu_smi, tools," in main and "run_hccn, tools," in main
    assert "run_npu_smi, module" not in main and "run_hccn, module" not in main
