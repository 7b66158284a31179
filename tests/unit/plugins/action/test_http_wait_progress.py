"""The pd_http_wait action plugin: progress lines during long health waits, same deadlines.

Before, a rank that took 10 minutes to load printed nothing until the task ended (a module cannot
print while it runs). The plugin runs the module slice by slice and prints which ranks it still
waits for between slices. Here the module is wait_all itself on a fake clock, shared with the plugin,
so the sliced wait is compared with one unsliced wait of the same engines.
"""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[4]
from ansible_collections.pd.deploy.plugins.module_utils import pd_http
from tests.fixtures.fake_clock import FakeClock

from ansible_collections.pd.deploy.plugins.action import pd_http_wait as plugin


class Clock(FakeClock):
    """Also stands in for the time module the action plugin reads (time.monotonic)."""

    def monotonic(self):
        return self.now


def engines(clock, ready_at):
    """send() of engines that answer 503 until ``ready_at[url]`` (None: never), each request 0.1 s."""
    def send(url, method, body, timeout):
        clock.now += 0.1
        at = ready_at[url]
        if at is not None and clock.now >= at:
            return 200, b"", ""
        return (503, b"", "") if clock.now > 20 else (0, b"", "ConnectionRefusedError: [Errno 111] Connection refused")
    return send


class Lines:
    def __init__(self):
        self.lines = []

    def display(self, text):
        self.lines.append(text)


def make_action(args, clock, send, task_vars=None):
    """The plugin with its module run replaced by wait_all on the fake clock; returns (action, runs)."""
    task = SimpleNamespace(args=args, async_val=0, check_mode=False, diff=False, action="pd_http_wait",
                           delegate_to=None, environment=None, become=False, no_log=False)
    action = plugin.ActionModule.__new__(plugin.ActionModule)
    action._task = task
    action._supports_check_mode = True
    action._supports_async = False
    runs = []

    def execute(name, module_args=None, task_vars=None):
        assert name == "pd_http_wait"
        runs.append(module_args)
        params = dict(module_args)
        return {"changed": False, "results": pd_http.wait_all(
            params["checks"], params.get("interval", 5), clock=clock, sleep=clock.sleep, send=send,
            slice_s=params.get("slice_s", 0), first_interval=params.get("first_interval", pd_http.FIRST_INTERVAL_S))}

    action._execute_module = execute
    return action, runs


@pytest.fixture
def fake(monkeypatch):
    clock, lines = Clock(), Lines()
    monkeypatch.setattr(plugin, "time", clock)
    monkeypatch.setattr(plugin, "display", lines)
    monkeypatch.setattr(plugin.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    return clock, lines


CHECKS = [{"name": "pd-c-decode0-dp0", "url": "d0", "timeout_s": 300},
          {"name": "pd-c-decode0-dp1", "url": "d1", "timeout_s": 300},
          {"name": "pd-c-decode0-dp2", "url": "d2", "timeout_s": 200}]
READY = {"d0": 45, "d1": 250, "d2": None}


def test_sliced_wait_prints_progress_and_ends_like_one_wait(fake):
    clock, lines = fake
    action, runs = make_action({"checks": CHECKS, "interval": 5}, clock, engines(clock, READY))
    out = action.run(task_vars={"inventory_hostname": "c-d0", "pd_health_progress_s": 60})
    sliced_end = clock.now

    whole_clock = Clock()
    whole = pd_http.wait_all(CHECKS, 5, clock=whole_clock, sleep=whole_clock.sleep, send=engines(whole_clock, READY))

    assert [r["ok"] for r in out["results"]] == [r["ok"] for r in whole] == [True, True, False]
    assert out["all_ok"] is False
    # each check keeps its deadline from the start of the task: dp2 gives up at about its 200 s, the
    # wait ends when dp1 answers, as in one unsliced wait (a slice boundary may add one interval)
    for sliced, single in zip(out["results"], whole):
        assert abs(sliced["waited_s"] - single["waited_s"]) <= 5 + 0.5
        assert "pending" not in sliced
    assert abs(sliced_end - whole_clock.now) <= 5 + 0.5
    assert 190 <= out["results"][2]["waited_s"] <= 210 and out["results"][2]["error"] == "HTTP 503"
    # one module run per 60 s slice, the later ones only for the checks still pending
    assert len(runs) == 5
    assert [len(r["checks"]) for r in runs] == [3, 2, 2, 2, 1]
    assert all(r["slice_s"] == 60 for r in runs)
    # the short first pauses only at the wait's start: a later slice polls at the interval from its start
    assert "first_interval" not in runs[0] and all(r["first_interval"] == 5 for r in runs[1:])
    # a line per slice boundary naming what is still loading, then one closing line
    assert len(lines.lines) == 5
    assert lines.lines[0].startswith("c-d0: waiting for 2 of 3 health URLs after 1m 0")
    assert "(timeout 5m 00s)" in lines.lines[0]
    assert "pd-c-decode0-dp1 (HTTP 503)" in lines.lines[0] and "pd-c-decode0-dp0" not in lines.lines[0]
    assert lines.lines[3].startswith("c-d0: waiting for 1 of 3") and "pd-c-decode0-dp2" not in lines.lines[3]
    assert lines.lines[-1].startswith("c-d0: 2 of 3 health URLs answered after 4m 1")


def test_a_wait_shorter_than_a_slice_is_one_module_run_and_prints_nothing(fake):
    clock, lines = fake
    action, runs = make_action({"checks": CHECKS[:1], "interval": 5}, clock, engines(clock, {"d0": 30}))
    out = action.run(task_vars={"inventory_hostname": "h"})
    assert out["all_ok"] and len(runs) == 1 and runs[0]["slice_s"] == plugin.DEFAULT_PROGRESS_S
    assert lines.lines == []


def test_no_checks_no_module_run_and_progress_zero_is_one_unsliced_run(fake):
    clock, lines = fake
    action, runs = make_action({"checks": []}, clock, engines(clock, {}))
    assert action.run(task_vars={}) == {"changed": False, "results": [], "all_ok": True}
    assert runs == []
    action, runs = make_action({"checks": CHECKS, "interval": 5, "progress_s": 0}, clock, engines(clock, READY))
    out = action.run(task_vars={"pd_health_progress_s": 60})   # the task's own progress_s wins
    assert len(runs) == 1 and runs[0]["slice_s"] == 0 and lines.lines == []
    assert [r["ok"] for r in out["results"]] == [True, True, False]
    assert "progress_s" not in runs[0]


def test_progress_s_that_is_no_number_is_refused(fake):
    clock, _ = fake
    action, _ = make_action({"checks": CHECKS}, clock, engines(clock, READY))
    with pytest.raises(plugin.AnsibleActionFail, match="progress_s: 'soon' is not a number"):
        action.run(task_vars={"pd_health_progress_s": "soon"})


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (9.4, "9s"), (75, "1m 15s"), (1800, "30m 00s"),
                                           (3725, "1h 02m 05s")])
def test_duration(seconds, text):
    assert plugin.duration(seconds) == text


def test_wait_all_slice_marks_what_is_still_within_its_deadline():
    clock = Clock()
    out = pd_http.wait_all(CHECKS, 5, clock=clock, sleep=clock.sleep, send=engines(clock, READY), slice_s=60)
    assert [r.get("pending", False) for r in out] == [False, True, True]
    assert out[0]["ok"] and 60 <= clock.now < 66


@pytest.mark.ansible
def test_a_real_ansible_run_prints_the_progress_lines(tmp_path):
    """ansible-core loads the action plugin for the module and its lines reach the operator's terminal.

    The engine answers 503 to its first two requests and 200 to the third; with one round per slice
    (interval 1 s and first_interval 1 s: no short first pauses; pd_health_progress_s 1) that is two
    progress lines at any machine speed.
    """
    import http.server
    import json
    import subprocess
    import sys
    import threading

    seen = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            seen.append(self.path)
            self.send_response(200 if len(seen) >= 3 else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    args = {"checks": [{"name": "pd-t-decode0-dp0", "url": f"http://127.0.0.1:{server.server_port}/health",
                        "timeout_s": 120}], "interval": 1, "first_interval": 1}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOME=str(tmp_path), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "all", "-i", "t-d0,", "-c", "local",
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", "pd_health_progress_s=1",
             "-m", "pd.deploy.pd_http_wait", "-a", json.dumps(args)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        server.shutdown()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if line.startswith("t-d0: ")]
    assert len(lines) == 3, out
    assert all(line.startswith("t-d0: waiting for 1 of 1 health URLs after ") for line in lines[:2])
    assert lines[0].endswith("(timeout 2m 00s): pd-t-decode0-dp0 (HTTP 503)")
    assert lines[2].startswith("t-d0: 1 of 1 health URLs answered after ")
    assert "all_ok: true" in out and "attempts: 3" in out
