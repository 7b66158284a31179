"""The rollout's tasks per host (issue 24 item 3): what a first deploy runs on each host, and that the
tasks folded together keep what they did.

Each task is a round of the play over the batch's hosts (a worker, templating, a callback), whatever
it does; docs/design.md "The rollout's cost per batch" lists the ones left and why each stays.
"""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixtures.json_play import run_json_play

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def _tasks(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _flat(tasks):
    """Every task of a task list, blocks opened (block, rescue, always)."""
    out = []
    for task in tasks:
        out.append(task)
        for key in ("block", "rescue", "always"):
            out.extend(_flat(task.get(key) or []))
    return out


def test_the_rollout_imports_the_engine_and_proxy_roles_instead_of_including_them():
    roll = _flat(_tasks(ROLES / "pd_rollout/tasks/roll.yml"))
    imports = [t["ansible.builtin.import_role"]["name"] for t in roll if "ansible.builtin.import_role" in t]
    assert imports == ["pd.deploy.pd_engine", "pd.deploy.pd_proxy"]
    assert not [t for t in roll if "ansible.builtin.include_role" in t or "include_role" in t]


def test_the_engine_waves_are_a_role_variable_not_a_set_fact_task():
    tasks = _flat(_tasks(ROLES / "pd_engine/tasks/main.yml"))
    assert not [t for t in tasks if "_pd_engine_waves" in (t.get("ansible.builtin.set_fact") or {})]
    role_vars = _tasks(ROLES / "pd_engine/vars/main.yml")
    assert "pd_rollout_waves" in role_vars["_pd_engine_waves"]
    # without the batch's probes (the role run on its own) there are no waves: every rank at once
    assert role_vars["_pd_engine_waves"].strip().startswith("{{ none if pd_engine_batch_probes is none")


def test_the_log_scan_is_one_read_and_one_verdict():
    scan = _tasks(ROLES / "pd_rollout/tasks/scan_logs.yml")
    keywords = {"name", "register", "when", "vars", "failed_when", "check_mode", "become"}
    assert [[k for k in t if k not in keywords] for t in scan] == [["pd.deploy.pd_container_logs"], ["ansible.builtin.debug"]]


def test_a_created_proxy_gets_no_backends_file_and_a_restarted_one_is_rewired():
    tasks = {t["name"]: t for t in _tasks(ROLES / "pd_proxy/tasks/main.yml")}
    created = "_pd_proxy_spec.name not in pd_container_plan.created | default([])"
    wire = tasks["Wire the proxy to the cluster's instances (add the new, then drain out the dropped)"]
    copy = tasks["Keep the plan's backend lists in the proxy's container (what it serves after a restart)"]
    # both skip only a proxy this run created (pd_replacement_plan created), not every proxy it started
    assert created in wire["when"] and created in copy["when"]
    assert not any(".start" in cond for cond in wire["when"] + copy["when"])


# ---- the scan's verdict, run as the rollout runs it -------------------------------------------------

SHM = "RuntimeError: Insufficient space in /dev/shm: 16379 MiB required, 7746 MiB free"
RECOMPUTE = ("WARNING 12-01 08:00:02 [platform.py:900] recompute_scheduler_enable is ignored on PD-disaggregated "
             "P nodes (kv_role='kv_producer') and will be deprecated")


def _frame(text):
    """A Docker log body without a TTY: 8 framing bytes (stream 1, length) before each chunk."""
    data = text.encode()
    return base64.b64encode(b"\x01\x00\x00\x00" + len(data).to_bytes(4, "big") + data).decode()


@pytest.mark.ansible
def test_the_verdict_fails_on_failure_lines_warns_on_warning_lines_and_is_skipped_on_clean_logs(tmp_path):
    verdict = _tasks(ROLES / "pd_rollout/tasks/scan_logs.yml")[1]
    logs = {
        "failing": {"pd-c-decode0-dp0": f"{SHM}\n", "pd-c-prefill0-dp0": f"{RECOMPUTE}\n"},
        "warning": {"pd-c-prefill0-dp0": f"{RECOMPUTE}\n"},
        "clean": {"pd-c-prefill0-dp0": "INFO ready\n"},
    }
    read = {host: {"logs": [{"item": {"name": n}, "status": 200, "error": "", "content": _frame(t)}
                            for n, t in by_name.items()]}
            for host, by_name in logs.items()}
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Registered read", "ansible.builtin.set_fact": {"__pd_rollout_log_read": "{{ reads[inventory_hostname] }}"}},
        verdict]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "reads.json").write_text(json.dumps({"reads": read}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
                           "-i", "failing,warning,clean", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'reads.json'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    hosts = json.loads(proc.stdout)["plays"][0]["tasks"][1]["hosts"]
    failing, warning, clean = hosts["failing"], hosts["warning"], hosts["clean"]
    assert failing["failed"] and failing["msg"].startswith("pd-c-decode0-dp0: shm-too-small: ")
    assert "recompute-on-producer" in failing["msg"]  # the warnings are listed after the failures
    assert not warning.get("failed") and warning["msg"].startswith("pd-c-prefill0-dp0: recompute-on-producer: ")
    assert clean.get("skipped") and not clean.get("failed")


def _role_options(role):
    return set(_tasks(ROLES / role / "meta/argument_specs.yml")["argument_specs"]["main"]["options"])


def test_the_roles_the_rollout_runs_skip_their_own_argument_check_and_pass_only_the_options_it_excludes():
    """pd_rollout checks its variables and those of pd_engine, pd_proxy and pd_container in one task; the
    options it leaves out of that check are exactly those the rollout's roles pass themselves."""
    passed, runs = set(), []
    files = [ROLES / "pd_rollout/tasks/roll.yml", *sorted((ROLES / "pd_engine/tasks").glob("*.yml")),
             *sorted((ROLES / "pd_proxy/tasks").glob("*.yml"))]
    checked = _role_options("pd_engine") | _role_options("pd_proxy") | _role_options("pd_container")
    for path in files:
        for task in _flat(_tasks(path)):
            passed |= set(task.get("vars") or {}) & checked
            for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
                if key in task:
                    runs.append((path.name, task[key]["name"].removeprefix("pd.deploy."), task[key].get("rolespec_validate")))
    assert {name for _, name, _ in runs} == {"pd_engine", "pd_proxy", "pd_container"}
    assert all(validate is False for _, _, validate in runs), runs
    variables = _tasks(ROLES / "pd_rollout/vars/main.yml")
    assert set(variables["_pd_rollout_passed_options"]) == passed
    assert variables["_pd_rollout_checked_roles"] == ["pd_rollout", "pd_engine", "pd_proxy", "pd_container"]
    rollout_play = next(p for p in _tasks(REPO / "playbooks/deploy_pd.yml") if "pd_rollout" in str(p.get("tasks")))
    deploy = _flat(rollout_play["tasks"])
    assert deploy[0]["ansible.builtin.include_role"] == {"name": "pd.deploy.pd_rollout", "rolespec_validate": False}
    # the check is the rollout's first task, before the lock
    assert "check.yml" in str(_tasks(ROLES / "pd_rollout/tasks/main.yml")[0])


@pytest.mark.ansible
def test_the_rollouts_one_argument_check_refuses_a_bad_variable_of_each_role_it_runs(tmp_path):
    # the roles' socket defaults read the plan's host entry (validate.yml publishes it on localhost)
    plan = {"hosts": {"localhost": {"docker_socket": "/var/run/docker.sock"}}}
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"pd_plan_fleet": plan}},
        {"ansible.builtin.include_role": {"name": "pd.deploy.pd_rollout", "tasks_from": "check.yml",
                                          "rolespec_validate": False}}]}]

    def run(*extra):
        return run_json_play(tmp_path, play, *extra)["plays"][0]["tasks"][2]["hosts"]["localhost"]

    assert not run().get("failed")
    bad = run("-e", "pd_container_pull=bogus", "-e", "pd_proxy_smoke_max_tokens=x", "-e", "pd_rollout_scan_lines=y",
              "-e", "pd_engine_role=all")
    assert bad["failed"]
    errors = "\n".join(bad["argument_errors"])
    assert "pd_container_pull must be one of: never, missing, always, got: bogus" in errors
    assert "'pd_proxy_smoke_max_tokens'" in errors and "'pd_rollout_scan_lines'" in errors
    # the options the rollout's roles pass themselves are not in this check
    assert set(bad["argument_spec_data"]).isdisjoint(_tasks(ROLES / "pd_rollout/vars/main.yml")["_pd_rollout_passed_options"])
    assert {"pd_container_health_delay", "pd_proxy_smoke", "pd_rollout_lock_dir"} <= set(bad["argument_spec_data"])


# ---- the locks go back in the log scan's read, the rest in the unlock task -------------------------

def _named(path, prefix):
    return next(t for t in _flat(_tasks(path)) if t.get("name", "").startswith(prefix))


@pytest.mark.ansible
def test_the_log_read_gives_back_the_locks_kept_on_its_host_and_the_unlock_task_the_others(tmp_path):
    """The batch's lock, read and unlock tasks as the role runs them (the role's vars, the real modules):
    a lock kept on a host of the batch goes back in that host's log read; one kept on a host outside the
    batch (--limit) by the unlock task; a lock another run holds is left to it."""
    locks = tmp_path / "locks"
    take = _named(ROLES / "pd_rollout/tasks/main.yml", "Take the deploy lock")
    read = _named(ROLES / "pd_rollout/tasks/scan_logs.yml", "Read the last lines")
    unlock = _named(ROLES / "pd_rollout/tasks/unlock.yml", "Give back the deploy lock")
    read["pd.deploy.pd_container_logs"]["names"] = ["pd-c1-prefill0-dp0"]  # no Docker here: reported as unreadable
    for task in (take, read, unlock):
        task.pop("become")  # this test runs as whoever runs pytest, on files under tmp_path
        task.pop("tags", None)
    role_vars = _tasks(ROLES / "pd_rollout/vars/main.yml")
    play_vars = {k: role_vars[k] for k in ("_pd_rollout_held", "_pd_rollout_released")}
    # c1 and c2 on hosts of the batch; c3 on a host outside it (--limit): each its own first host
    play_vars.update(_pd_rollout_locks=[{"cluster": "c1", "host": "h1"}, {"cluster": "c2", "host": "h2"},
                                        {"cluster": "c3", "host": "far"}],
                     pd_rollout_lock_dir=str(locks), pd_rollout_scan_lines=10,
                     pd_rollout_docker_socket=str(tmp_path / "no-docker.sock"))
    look = {"name": "Lock files", "ansible.builtin.find": {"paths": str(locks), "patterns": "*.lock"},
            "run_once": True, "register": "found"}
    # another run takes c2's lock back between the batch's take and its read: its read leaves it alone
    other = {"name": "Another run's lock", "ansible.builtin.copy": {
        "dest": str(locks / "c2.lock"), "content": json.dumps({"run_id": "elsewhere:1:1", "pid": 1})},
        "run_once": True}
    play = [{"hosts": "h1,h2", "gather_facts": False, "vars": play_vars, "tasks": [
        take, dict(look, register="after_take"), other, read, dict(look, register="after_read"), unlock, look]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "hosts": {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                  for h in ("h1", "h2", "far")}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
                           "-i", str(tmp_path / "hosts.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    assert proc.returncode == 0, proc.stdout[-3000:]

    def files(index):
        return sorted(Path(f["path"]).name for f in tasks[index]["hosts"]["h1"]["files"])

    assert files(1) == ["c1.lock", "c2.lock", "c3.lock"]
    reads = tasks[3]["hosts"]
    assert reads["h1"]["released"] == [str(locks / "c1.lock")] and reads["h1"]["changed"]
    assert reads["h2"]["released"] == [] and not reads["h2"]["changed"]  # c2's is another run's now
    assert reads["h1"]["logs"][0]["status"] == 0  # the read itself still reports each rank
    assert files(4) == ["c2.lock", "c3.lock"]
    # the unlock task: c1 skipped (given back), c2 tried and left to its holder, c3 given back
    items = {r["item"]["cluster"]: r for r in tasks[5]["hosts"]["h1"]["results"]}
    assert items["c1"].get("skipped") and not items["c2"].get("skipped") and items["c3"]["changed"]
    assert files(6) == ["c2.lock"]
    assert json.loads((locks / "c2.lock").read_text())["run_id"] == "elsewhere:1:1"
