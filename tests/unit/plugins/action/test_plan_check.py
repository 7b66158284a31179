"""pd_plan's judgement of the plan in one controller task (plugins/action/pd_plan_check.py) and the
inventory's refusal and name (plugin_utils.report.summary.inventory_problem / inventory_note).

issue 24: a no-op re-run paid six pd_plan tasks and two validate plays (each task a worker process,
about 0.2 s even when skipped). The texts are the ones validate.yml's tasks printed, word for word.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.unit.plugins.plugin_utils.plan.test_fleet import cluster_a, example_fleet

REPO = Path(__file__).resolve().parents[4]
from ansible_collections.pd.deploy.plugins.action import pd_plan_check as action  # noqa: E402
INV = ["/etc/pd/prod"]


def never(*_):
    raise AssertionError("nothing may be written")


def sync():
    return action.pd_write_files.sync_files


# ---- the inventory's refusal and its name (validate.yml's first play and its note, as functions) ----

def test_an_inventory_without_clusters_is_refused_with_the_fix():
    assert report.inventory_problem(["/tmp/empty.yml"], 0, False, True) == (
        "The inventory /tmp/empty.yml holds no cluster: the group pd_clusters has no hosts. Name your fleet's "
        "inventory with -i inventories/<fleet> (copy inventories/example) and list each cluster as a child "
        "group of pd_clusters.")
    # whatever the playbook: validate.yml refuses it too
    assert report.inventory_problem(["a", "b"], 0, False, False).startswith("The inventory a, b holds no cluster")


def test_the_demo_inventory_is_refused_only_where_containers_would_start():
    assert report.inventory_problem(["/x/inventories/local"], 2, True, True) == (
        "/x/inventories/local is the embedded demo inventory (pd_inventory_render_only): it only renders, it "
        "never starts containers on this controller. Add -e pd_render_only=true to render, or name your fleet's "
        "inventory with -i inventories/<fleet>.")
    assert report.inventory_problem(["/x/inventories/local"], 2, True, False) == ""
    assert report.inventory_problem(INV, 4, False, True) == ""


def test_the_note_names_the_inventory_and_says_when_it_is_the_demo():
    assert report.inventory_note(INV, 4, False) == "Checking the inventory /etc/pd/prod (4 cluster host(s))."
    assert report.inventory_note(["/x/inventories/local"], 2, True) == (
        "Checking the inventory /x/inventories/local (2 cluster host(s)): the embedded demo inventory (the "
        "default of ansible.cfg when no -i is given), not a fleet; name the inventory of your fleet with "
        "-i inventories/<fleet>.")


# ---- check(): the order of the old tasks, in one call -------------------------------------------

def test_a_refused_inventory_fails_first_and_writes_nothing(tmp_path):
    plan = fleet.plan_fleet({"hosts": [], "limit": None})
    out = action.check(plan, INV, 0, build_dir=str(tmp_path), write=never)
    assert out["failed"] and "holds no cluster" in out["msg"] and "inventory" not in out
    demo = action.check(fleet.plan_fleet(example_fleet()), INV, 5, demo=True, refuse_demo=True,
                        build_dir=str(tmp_path), write=never)
    assert demo["failed"] and "embedded demo inventory" in demo["msg"]
    assert list(tmp_path.iterdir()) == []


def test_a_broken_plan_fails_with_every_violation_once_and_writes_nothing(tmp_path):
    a = cluster_a()
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.96}
    a["prefill"]["engine"] = {"gpu_memory_utilization": 0.97}
    plan = fleet.plan_fleet(example_fleet(a=a))
    out = action.check(plan, INV, 5, build_dir=str(tmp_path), write=never)
    assert out["failed"] and out["violations"] == report.plan_report(plan)
    assert out["msg"] == "The inventory breaks 2 rule(s) (and has 0 warning(s)), listed below; no host was touched."
    assert out["violations"].startswith("The inventory breaks 2 rule(s)")
    for message in plan["messages"]:
        assert sum(" ".join(message.split()) in v for v in out.values() if isinstance(v, str)) == 1
    assert out["inventory"] == "Checking the inventory /etc/pd/prod (5 cluster host(s))."
    assert list(tmp_path.iterdir()) == []


def test_a_good_plan_writes_its_files_once_and_shows_warnings_then_capacity(tmp_path):
    a = cluster_a()
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.9}   # a warning: the plan stays ok
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert plan["ok"] and plan["messages"]
    out = action.check(plan, INV, 5, build_dir=str(tmp_path), write=sync())
    files = report.build_files(plan, str(tmp_path))
    assert not out.get("failed") and out["changed"] and out["written"] == len(files) and out["removed"] == []
    for entry in files:
        assert Path(entry["path"]).read_text(encoding="utf-8") == entry["content"]
    assert out["msg"] == report.capacity_lines(plan)
    assert out["violations"] == report.plan_report(plan)
    assert out["violations"].startswith("The inventory passes every rule, with ")
    # the no-op re-run: same plan, nothing to write
    again = action.check(plan, INV, 5, build_dir=str(tmp_path), write=sync())
    assert not again["changed"] and again["written"] == 0


def test_render_specs_and_the_files_of_the_last_run(tmp_path):
    plan = fleet.plan_fleet(example_fleet())
    render = action.check(plan, INV, 5, build_dir=str(tmp_path), render_specs=True, write=sync())
    with_specs = {f["path"] for f in report.build_files(plan, str(tmp_path), True)}
    without = {f["path"] for f in report.build_files(plan, str(tmp_path))}
    assert render["written"] == len(with_specs) and (tmp_path / "render" / "a-p0").is_dir()
    # a validate run after a render: the launch specs are the last run's files, not this one's
    out = action.check(plan, INV, 5, build_dir=str(tmp_path), write=sync())
    assert sorted(out["removed"]) == sorted(with_specs - without) and out["changed"]
    assert not (tmp_path / "render" / "a-p0").exists() and (tmp_path / "plan.json").is_file()
    assert out["msg"] == report.capacity_lines(plan) and "violations" not in out   # no warning


def test_a_bad_rollout_batch_is_refused_before_the_plan_checks_and_any_file(tmp_path):
    plan = fleet.plan_fleet(example_fleet())
    out = action.check(plan, INV, 5, build_dir=str(tmp_path), write=never, cluster_batch="0")
    assert out["failed"] and out["msg"] == order.cluster_batch_problem("0")
    assert "pd_cluster_batch: '0' is neither a number of clusters" in out["msg"] and "-e pd_cluster_batch=N" in out["msg"]
    assert action.check(plan, INV, 5, build_dir=str(tmp_path), write=never, cluster_batch=1,
                        parallel_clusters=True)["failed"]
    assert list(tmp_path.iterdir()) == []
    for good in (None, 1, "2", "50%"):
        assert not action.check(plan, INV, 5, build_dir="", write=never, cluster_batch=good).get("failed"), good
    # refused with the inventory's problems, before the plan's rules: the run's refusal (pd_plan_problem) that
    # deploy-pd.yml reports after it is this text, whatever the plan (issue 23 item 6)
    a = cluster_a()
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.96}
    broken = action.check(fleet.plan_fleet(example_fleet(a=a)), INV, 5, write=never, cluster_batch="0")
    assert broken["failed"] and broken["msg"] == order.cluster_batch_problem("0")
    # the rules come once the batch is fixed
    assert action.check(fleet.plan_fleet(example_fleet(a=a)), INV, 5, write=never,
                        cluster_batch="1")["msg"].startswith("The inventory breaks 1 rule(s)")


# ---- plan_problem (filter pd_plan_problem): the run's refusal, the same text as check()'s ---------

@pytest.mark.parametrize("args, where", [
    ((["/tmp/empty.yml"], 0), "holds no cluster"),
    ((["/x/inventories/local"], 2, True, True), "embedded demo inventory"),
    ((INV, 5, False, True, "0"), "pd_cluster_batch: '0' is neither"),
    ((INV, 5, False, True, 2, True), "pd_cluster_batch"),
    # the inventory first: a run without a cluster is not told about its batch size
    ((["/tmp/empty.yml"], 0, False, True, "0"), "holds no cluster"),
])
def test_the_runs_problem_is_the_text_check_fails_with(args, where):
    problem = report.plan_problem(*args)
    assert where in problem, problem
    assert report.plan_problem(*args) == problem  # pure: the same answer twice
    names = ("inventory", "cluster_hosts", "demo", "refuse_demo", "cluster_batch", "parallel_clusters")
    out = action.check(fleet.plan_fleet(example_fleet()), write=never, **dict(zip(names, args)))
    assert out["failed"] and out["msg"] == problem


@pytest.mark.parametrize("args", [(INV, 5), (INV, 5, False, True, None), (INV, 5, False, True, "50%"),
                                  (["/x/inventories/local"], 2, True, False, 1), (INV, 5, False, True, 2, False)])
def test_a_run_that_can_be_planned_has_no_problem(args):
    assert report.plan_problem(*args) == ""


@pytest.mark.parametrize("args, field", [((INV, "5"), "cluster_hosts"), ((INV, True), "cluster_hosts"),
                                         ((INV, 5, "false"), "demo"), ((INV, 5, False, 1), "refuse_demo"),
                                         ((INV, 5, False, False, 1, "yes"), "parallel_clusters")])
def test_the_runs_problem_names_a_mistyped_argument(args, field):
    with pytest.raises(PdError, match=f"pd_plan_problem: {field}: .* — pass "):
        report.plan_problem(*args)


def test_pd_plan_make_publishes_the_plan_the_resolved_build_dir_and_the_runs_problem(tmp_path):
    from ansible_collections.pd.deploy.plugins.action import pd_plan_make
    plan = fleet.plan_fleet(example_fleet())
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    values = {"pd_plan_report_failure": True, "pd_plan_refuse_demo": False, "pd_plan_cluster_batch": "0",
              "pd_plan_build_dir": str(tmp_path / "link")}
    made = pd_plan_make.facts(values, plan, INV, 5)
    assert made["pd_plan_fleet"] is plan and made["pd_plan_build_dir"] == str(tmp_path / "real")
    # the same text as the check's refusal (one function: summary.plan_problem)
    assert made["pd_plan_problem"] == report.plan_problem(INV, 5, False, False, "0") and "pd_cluster_batch" in made["pd_plan_problem"]
    # without pd_plan_report_failure the check ends the run itself: no problem kept
    assert pd_plan_make.facts(dict(values, pd_plan_report_failure=False), plan, INV, 5)["pd_plan_problem"] == ""


@pytest.mark.ansible
def test_a_refused_pd_plan_variable_fails_the_first_task_before_any_plan(tmp_path):
    """validate.yml includes pd_plan without Ansible's argument-check task: its first task checks instead."""
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/validate.yml", "-i",
                           "inventories/example", "-e", f"pd_plan_build_dir={tmp_path}/build", "-e",
                           "pd_plan_write_reports=maybe", "-e", "pd_plan_render_specs=perhaps"],
                          cwd=REPO, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Validation of arguments failed" in out, out
    assert "pd_plan_write_reports" in out and "pd_plan_render_specs" in out, out
    assert "Stop before touching any host" not in out and not (tmp_path / "build").exists()


def test_no_build_dir_writes_nothing():
    out = action.check(fleet.plan_fleet(example_fleet()), INV, 5, build_dir="", write=never)
    assert not out.get("failed") and not out["changed"] and out["written"] == 0


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path):
    plan = fleet.plan_fleet(example_fleet())
    files = report.build_files(plan, str(tmp_path), True)
    dry = action.check(plan, INV, 5, build_dir=str(tmp_path), render_specs=True,
                       write=action.pd_write_files.preview_files, dry_run=True)
    assert list(tmp_path.iterdir()) == []
    assert dry["changed"] and sorted(dry["would_write"]) == sorted(f["path"] for f in files) and dry["would_remove"] == []
    assert dry["check_mode"] == f"--check: nothing written under {tmp_path} ({len(files)} file(s) would change, 0 would be removed)"
    assert "written" not in dry and dry["msg"] == report.capacity_lines(plan)
    # after a real run: a --check of the same plan would change nothing; one without the render specs would remove them
    action.check(plan, INV, 5, build_dir=str(tmp_path), render_specs=True, write=sync())
    before = sorted(p for p in tmp_path.rglob("*"))
    same = action.check(plan, INV, 5, build_dir=str(tmp_path), render_specs=True,
                        write=action.pd_write_files.preview_files, dry_run=True)
    assert not same["changed"] and same["would_write"] == []
    fewer = action.check(plan, INV, 5, build_dir=str(tmp_path), write=action.pd_write_files.preview_files, dry_run=True)
    without = {f["path"] for f in report.build_files(plan, str(tmp_path))}
    assert sorted(fewer["would_remove"]) == sorted({f["path"] for f in files} - without)
    assert sorted(p for p in tmp_path.rglob("*")) == before


# ---- the task as Ansible runs it ----------------------------------------------------------------

def run_task(args, cwd, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-e", f"ansible_python_interpreter={sys.executable}", *extra,
                           "-m", "pd.deploy.pd_plan_check", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"], proc.stderr


@pytest.mark.ansible
def test_the_action_runs_in_ansible_and_warns_when_another_inventory_owned_the_directory(tmp_path):
    plan = fleet.plan_fleet(example_fleet())
    args = {"plan": plan, "inventory": INV, "cluster_hosts": 5, "build_dir": str(tmp_path / "b")}
    first, stderr = run_task(args, tmp_path)
    assert "Traceback" not in stderr, stderr
    assert not first.get("failed") and first["changed"] and first["inventory"].startswith("Checking the inventory")
    assert first["msg"] == report.capacity_lines(plan)
    assert json.loads((tmp_path / "b" / "plan.json").read_text()) == plan
    other, stderr = run_task(dict(args, inventory=["/etc/pd/stage"]), tmp_path)
    assert not other.get("failed"), stderr
    assert any("held the output of inventory /etc/pd/prod; replaced by the output of /etc/pd/stage" in w
               for w in other.get("warnings", [])), other
    # --check writes nothing (it did: the review files were written in check mode)
    checked, stderr = run_task(dict(args, build_dir=str(tmp_path / "c")), tmp_path, "--check")
    assert not checked.get("failed"), stderr
    assert not (tmp_path / "c").exists() and checked["check_mode"].startswith("--check: nothing written under")
    bad, _ = run_task(dict(args, cluster_hosts="many"), tmp_path)
    assert bad["failed"] and "cluster_hosts is a number" in bad["msg"] and "Traceback" not in bad["msg"]


# ---- what a no-op re-run runs of validate.yml -----------------------------------------------------

def test_validate_is_one_play_and_pd_plan_two_tasks():
    plays = yaml.safe_load((REPO / "playbooks" / "validate.yml").read_text())
    assert len(plays) == 1 and plays[0]["hosts"] == "localhost:pd_clusters"
    tasks = yaml.safe_load((REPO / "roles" / "pd_plan" / "tasks" / "main.yml").read_text())
    assert [next(k for k in t if k != "name" and not k.startswith(("run_once", "delegate", "check_mode")))
            for t in tasks] == ["pd.deploy.pd_plan_make", "pd.deploy.pd_plan_check"]
    # no argument-check task of Ansible's: the first task checks the role's variables
    include = plays[0]["tasks"][0]["ansible.builtin.include_role"]
    assert include["name"] == "pd.deploy.pd_plan" and include["rolespec_validate"] is False
    assert tasks[0]["pd.deploy.pd_plan_make"]["check_role_options"] == "main"
    assert sorted(os.listdir(REPO / "roles" / "pd_plan" / "tasks")) == ["main.yml"]


def test_a_no_op_deploy_runs_no_skipped_check_task():
    """The checks that only ever skip on a no-op are folded into tasks that run anyway."""
    deploy = yaml.safe_load((REPO / "playbooks" / "deploy_pd.yml").read_text())
    # deploy_pd.yml imports prechecks.yml (validate + the prechecks play, also run alone)
    assert deploy[0]["ansible.builtin.import_playbook"] == "prechecks.yml"
    prechecks = yaml.safe_load((REPO / "playbooks" / "prechecks.yml").read_text())
    prechecks_play = next(p for p in prechecks if p.get("name") == "Check every host before any is touched")
    assert [t.get("ansible.builtin.include_role", {}).get("name") for t in prechecks_play["tasks"]] == ["pd.deploy.pd_prechecks"]
    tasks = yaml.safe_load((REPO / "roles" / "pd_prechecks" / "tasks" / "main.yml").read_text())
    # the probe and the host's own judgement in one task per host, then one task for the play (issue 24: there
    # was a check task per host between them)
    assert [next(k for k in t if k.startswith(("ansible.builtin.", "pd.deploy."))) for t in tasks] == [
        "pd.deploy.pd_host_check", "pd.deploy.pd_prechecks_decide", "ansible.builtin.include_tasks"]
    report = next(p for p in deploy if p.get("name", "").startswith("Report what each cluster runs"))
    # one task prints the report and hands it to the run's stats (AWX artifacts)
    assert [next(k for k in t if k.startswith(("ansible.builtin.", "pd.deploy."))) for t in report["tasks"]] == [
        "pd.deploy.pd_report"]
    # what only a failed rollout runs sits in plays that match no host on success
    after_failure = [p for p in deploy if p.get("name", "").endswith("(no host otherwise)")]
    assert len(after_failure) == 2 and all("_pd_report_failed | length > 0" in p["hosts"] for p in after_failure)
