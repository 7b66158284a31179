"""The cluster deploy lock (plugins/modules/pd_deploy_lock.py + plugins/action/pd_deploy_lock.py): one run at a
time per cluster; a lock held by a live run is never broken, a stale or foreign one only on request."""

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
from ansible_collections.pd.deploy.plugins.action import pd_deploy_lock as action  # noqa: E402


def test_this_run_names_the_controller_user_and_ansible_playbook_process():
    run = action.this_run()
    assert run["controller"] == socket.gethostname() and run["pid"] == os.getppid()
    assert run["run_id"] == f"{run['controller']}:{run['pid']}:{run['pid_start']}"
    assert run["started"].endswith("Z") and run["user"]


def test_holder_state_live_stale_or_unknown():
    me = socket.gethostname()
    mine = {"controller": me, "pid": os.getpid(), "pid_start": action.process_start(os.getpid())}
    assert action.holder_state(mine, me) == "live"
    # same pid, another start time: the pid was reused by another process, the holder is gone
    assert action.holder_state(dict(mine, pid_start=(mine["pid_start"] or 0) + 1), me) == "stale"
    assert action.holder_state(dict(mine, pid=2 ** 22 + 7), me) == "stale"
    assert action.holder_state(dict(mine, controller="other"), me) == "unknown"
    assert action.holder_state({}, me) == "unknown"
    # a process under that id, but nothing to compare its start time with: cannot be proven alive
    assert action.holder_state({k: v for k, v in mine.items() if k != "pid_start"}, me) == "unproven"
    assert action.holder_state(dict(mine, pid_start=None), me) == "unproven"


def test_holder_state_without_proc_is_unproven_not_live(monkeypatch):
    """Where /proc cannot be read the process under the id cannot be compared: breakable, never live."""
    me = socket.gethostname()
    monkeypatch.setattr(action, "process_start", lambda pid: None)
    assert action.holder_state({"controller": me, "pid": os.getpid(), "pid_start": 12345}, me) == "unproven"


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_lock_without_start_time_whose_pid_is_reused_is_unproven_and_says_so(sleeper):
    me = socket.gethostname()
    holder = {"user": "sre", "controller": me, "pid": sleeper.pid, "started": "2026-12-01T10:02:00Z"}
    state = action.holder_state(holder, me)
    assert state == "unproven"
    text = action.refusal("cluster_a", "a-p0", "/l/cluster_a.lock", holder, state, True)
    assert f"Process id {sleeper.pid} now belongs to another program (sleep)." in text
    assert "cannot be proven to be that run: the lock records no process start time" in text
    assert "pd_deploy_break_lock=true" in text and "alive" not in text
    # a recorded start time that differs: the id was reused, the holder is gone (and the program named)
    stale = dict(holder, pid_start=(action.process_start(sleeper.pid) or 0) + 1)
    assert action.holder_state(stale, me) == "stale"
    assert "now belongs to another program (sleep)" in action.refusal("c", "h", "/l", stale, "stale", False)


@pytest.mark.parametrize("state, says", [
    ("live", "still going on this controller"),
    ("stale", "the run was killed or lost its hosts"),
    ("unproven", "cannot be proven to be that run"),
    ("unknown", "cannot be checked from this controller"),
])
def test_refusal_names_cluster_host_holder_and_the_way_out(state, says):
    holder = {"user": "sre", "controller": "ctl1", "pid": 4242, "started": "2026-12-01T10:02:00Z"}
    text = action.refusal("cluster_a", "a-p0", "/var/lib/pd-deploy/locks/cluster_a.lock", holder, state, False)
    assert text.startswith("cluster cluster_a: its deploy lock (a-p0:/var/lib/pd-deploy/locks/cluster_a.lock) is held "
                           "by another run: sre@ctl1, ansible-playbook pid 4242, started 2026-12-01T10:02:00Z.")
    assert says in text
    assert ("pd_deploy_break_lock=true" in text) == (state != "live")


def lock(tmp_path, *extra, state="acquired", cluster="cluster_a"):
    """Run the lock task as deploy-pd.yml does (action plugin + module), in its own ansible process."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    args = {"cluster": cluster, "dir": str(tmp_path), "state": state, "lock_host": "a-p0"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-e", f"ansible_python_interpreter={sys.executable}", *extra,
                           "-m", "pd.deploy.pd_deploy_lock", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.mark.ansible
def test_a_lock_left_by_a_gone_run_refuses_until_broken_explicitly(tmp_path):
    first = lock(tmp_path)
    assert first["acquired"] and first["changed"] and not first.get("failed")
    path = tmp_path / "cluster_a.lock"
    holder = json.loads(path.read_text())
    assert holder["controller"] == socket.gethostname() and holder["pid"] != os.getpid()
    # that ansible process has ended without giving the lock back (as a killed deploy): stale. A run that
    # takes it, and two checks (state=checked: a look without taking it), one asking to break it, at the
    # same time (three ansible processes; none of them may write the lock)
    with ThreadPoolExecutor(max_workers=3) as pool:
        second, checked, checked_break = pool.map(lambda a: lock(tmp_path, *a[0], **a[1]), [
            ((), {}), ((), {"state": "checked"}), (("-e", "pd_deploy_break_lock=true"), {"state": "checked"})])
    assert second["failed"] and "the run was killed or lost its hosts" in second["msg"]
    assert f"ansible-playbook pid {holder['pid']}" in second["msg"] and "pd_deploy_break_lock=true" in second["msg"]
    assert json.loads(path.read_text()) == holder  # untouched
    # the check refuses the same way, and lets a run that asks to break it go on
    assert checked["failed"]
    assert not checked_break.get("failed")
    broke = lock(tmp_path, "-e", "pd_deploy_break_lock=true")
    assert broke["acquired"] and broke["broken"] == holder and "broke the deploy lock" in broke["msg"]
    assert json.loads(path.read_text())["pid"] != holder["pid"]


@pytest.mark.ansible
def test_a_live_holder_is_never_broken_and_another_run_cannot_release_it(tmp_path):
    me = {"run_id": "x", "controller": socket.gethostname(), "user": "sre", "pid": os.getpid(),
          "pid_start": action.process_start(os.getpid()), "started": "2026-12-01T10:02:00Z"}
    path = tmp_path / "cluster_a.lock"
    path.write_text(json.dumps(me))
    refused = lock(tmp_path, "-e", "pd_deploy_break_lock=true")
    assert refused["failed"] and "still going on this controller" in refused["msg"]
    assert "does not break the lock of a run that is alive" in refused["msg"]
    released = lock(tmp_path, state="released")
    assert not released.get("failed") and not released["changed"] and path.exists()


@pytest.mark.ansible
def test_a_lock_without_start_time_held_under_a_reused_pid_is_broken_with_the_switch(tmp_path, sleeper):
    old = {"run_id": "old", "controller": socket.gethostname(), "user": "sre", "pid": sleeper.pid,
           "started": "2026-12-01T10:02:00Z"}  # no pid_start: an older pd-deploy, or no /proc
    path = tmp_path / "cluster_a.lock"
    path.write_text(json.dumps(old))
    refused = lock(tmp_path)
    assert refused["failed"] and "cannot be proven to be that run" in refused["msg"]
    assert "now belongs to another program (sleep)" in refused["msg"]
    broke = lock(tmp_path, "-e", "pd_deploy_break_lock=true")
    assert broke["acquired"] and broke["broken"] == old
    assert "cannot be proven alive" in broke["msg"] and "(sleep)" in broke["msg"]


@pytest.mark.ansible
def test_a_lock_from_another_controller_is_refused_then_broken_on_request(tmp_path):
    other = {"run_id": "ctl2:1:1", "controller": "ctl2", "user": "sre", "pid": 1, "pid_start": 1,
             "started": "2026-12-01T10:02:00Z"}
    (tmp_path / "cluster_a.lock").write_text(json.dumps(other))
    refused = lock(tmp_path)
    assert refused["failed"] and "cannot be checked from this controller" in refused["msg"] and "sre on ctl2" in refused["msg"]
    assert lock(tmp_path, "-e", "pd_deploy_break_lock=true")["broken"] == other
    # a lock of another cluster is another file
    assert lock(tmp_path, cluster="cluster_b")["acquired"]


@pytest.mark.parametrize("value, expected", [
    (True, (True, None)), ("true", (True, None)), ("no", (False, None)), (None, (False, None)), ("", (False, None)),
    ("ctl2:1:1", (False, "ctl2:1:1")), (" 4711 ", (False, "4711")), ("awx-4711", (False, "awx-4711")),
])
def test_the_break_switch_or_a_named_holder(value, expected):
    assert action.break_request(value) == expected


def test_a_name_matches_the_run_id_or_the_awx_job_only():
    holder = {"run_id": "pod-1:12:345", "job": "4711"}
    assert action.names_holder(holder, "pod-1:12:345") and action.names_holder(holder, "4711")
    assert action.names_holder(holder, "awx-4711")
    assert not action.names_holder(holder, "4712") and not action.names_holder(holder, "pod-1")
    assert not action.names_holder({}, "4711") and not action.names_holder(holder, None)
    assert action.job_of({"awx_job_id": 4711}) == "4711" and action.job_of({"tower_job_id": "9"}) == "9"
    assert action.job_of({}) is None


def test_the_refusal_names_the_holder_to_give_and_a_wrong_name():
    holder = {"run_id": "pod-1:12:345", "job": "4711", "user": "awx", "controller": "pod-1", "pid": 12,
              "started": "2026-12-01T10:02:00Z"}
    text = action.refusal("cluster_a", "a-p0", "/l", holder, "unknown", False)
    assert "AWX job 4711" in text and "-e pd_deploy_break_lock=4711 to break this run's lock and no other" in text
    wrong = action.refusal("cluster_a", "a-p0", "/l", holder, "unknown", False, "4712")
    assert "pd_deploy_break_lock names 4712, not this holder (run id pod-1:12:345, AWX job 4711): nothing was broken" in wrong


@pytest.mark.ansible
def test_a_killed_awx_jobs_lock_is_broken_by_naming_it_and_no_other(tmp_path):
    # a job killed in AWX: its pod (controller) is gone, so its lock cannot be checked from here
    killed = {"run_id": "awx-pod-a:12:345", "controller": "awx-pod-a", "user": "awx", "pid": 12, "pid_start": 345,
              "started": "2026-12-01T10:02:00Z", "job": "4711"}
    live = dict(killed, run_id="awx-pod-b:12:999", controller="awx-pod-b", job="4712")
    (tmp_path / "cluster_a.lock").write_text(json.dumps(killed))
    (tmp_path / "cluster_b.lock").write_text(json.dumps(live))
    # naming the killed job breaks its lock, and only its lock: the live job's stays
    wrong = lock(tmp_path, "-e", "pd_deploy_break_lock=4711", cluster="cluster_b")
    assert wrong["failed"] and "names 4711, not this holder" in wrong["msg"]
    assert json.loads((tmp_path / "cluster_b.lock").read_text()) == live
    broke = lock(tmp_path, "-e", "pd_deploy_break_lock=4711", "-e", "awx_job_id=4800")
    assert broke["acquired"] and broke["broken"] == killed and "AWX job 4711" in broke["msg"]
    # the new holder records this run's AWX job, what the next refusal names
    assert json.loads((tmp_path / "cluster_a.lock").read_text())["job"] == "4800"
