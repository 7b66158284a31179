"""The prechecks' judgement in Python (plugin_utils.hostcheck.verdict, actions pd_host_check and
pd_prechecks_decide): the same probe arguments, problems, warnings and decision as the Jinja of the
role's former probe, check and decision tasks (issue 24: a check task per host is gone from every run).
"""

import copy
import re

import pytest

from ansible_collections.pd.deploy.plugins.action import pd_host_check, pd_prechecks_decide
from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import compat, netchecks, prechecks, verdict
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers, order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import controller
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.unit.plugins.plugin_utils.plan.test_fleet import example_fleet

PLAN = fleet.plan_fleet(example_fleet())
HOSTS = list(PLAN["hosts"])        # a-p0, a-d0, b-p0, b-d0, b-d1
ROOT = "/var/lib/pd-test/ascend"
DAEMON_OK = '{"log-opts": {"max-size": "100m", "max-file": "5"}, "default-ulimits": {"memlock": {"Name": "memlock", ' \
            '"Soft": -1, "Hard": -1}}}'


def settled_probe(host, docker_ok=True, daemon_json=DAEMON_OK):
    """What pd_host_check returns on a host read with pd_prechecks_skip (Docker and containers only),
    nothing running yet, judged."""
    probe = {"changed": False, "docker": {"ok": docker_ok, "msg": "" if docker_ok else "connection refused"},
             "containers": [], "images_missing": [], "health": [], "wiring": {}, "image_refs": {},
             "hccn": {}, "compat": {"daemon_json": daemon_json}}
    probe.update(verdict.host_judgement(host, PLAN["hosts"][host], probe, skip=True, compat_on=False))
    return probe


def probes(**changes):
    out = {h: settled_probe(h) for h in HOSTS}
    out.update(changes)
    return out


def test_the_probe_request_is_what_the_task_asked_for():
    host = PLAN["hosts"]["a-d0"]
    specs = containers.host_specs(host)
    images = list(dict.fromkeys(s["image"] for s in specs))
    got = verdict.probe_request(host, "/run/docker.sock", ROOT, probe_timeout=20, probe_interval=2)
    assert got == {
        "docker_socket": "/run/docker.sock",
        "paths": prechecks.required_paths(specs) + [host["model_path"]],
        "npu_smi": f"{ROOT}/usr/local/bin/npu-smi",
        "host_facts": True,
        "disk_path": host["model_path"],
        "images": images,
        "containers": containers.probe_specs(specs),
        "hccn": {"tool": f"{ROOT}/usr/local/Ascend/driver/tools/hccn_tool", "conf": f"{ROOT}/etc/hccn.conf",
                 "devices": netchecks.devices(specs)},
        "compat": {"images": images, "driver_info": f"{ROOT}/usr/local/Ascend/driver/version.info",
                   "daemon_json": "/etc/docker/daemon.json"},
        "probe_timeout": 20, "probe_interval": 2,
    }
    assert got["hccn"]["devices"] and got["containers"]


def test_skip_reads_only_docker_and_the_containers():
    host = PLAN["hosts"]["a-p0"]
    got = verdict.probe_request(host, "/var/run/docker.sock", skip=True)
    assert (got["paths"], got["npu_smi"], got["host_facts"], got["disk_path"], got["images"], got["hccn"],
            got["compat"]) == ([], "", False, "", [], {}, {})
    # the prefill host's proxy is probed too (its health and wiring)
    assert [c["name"] for c in got["containers"]] == [s["name"] for s in containers.host_specs(host)]
    assert verdict.probe_request(host, "/s", hccn=False, compat_on=False)["hccn"] == {}


def test_a_hosts_judgement_is_the_filters_of_the_former_check_task():
    host, entry = "a-d0", PLAN["hosts"]["a-d0"]
    specs = containers.host_specs(entry)
    probe = {"docker": {"ok": False, "msg": "no socket"}, "stats": {}, "containers": [], "health": [],
             "images_missing": [], "compat": {"images": {}, "driver_info": None, "daemon_json": None}}
    got = verdict.host_judgement(host, entry, probe, min_free_disk="20GiB", vllm_ascend_version="0.25.1")
    old = prechecks.problems({
        "host": host, "specs": specs, "model_path": entry["model_path"],
        # the task's `devices | flatten | select('search', 'davinci[0-9]') | unique | list | length`
        "npus_needed": len({d for s in specs for d in s["devices"] if re.search("davinci[0-9]", d)}),
        "ram_reserve_bytes": entry["ram_reserve_bytes"], "npu_chip": entry["npu_chip"],
        "hbm_per_npu_bytes": entry["hbm_per_npu_bytes"], "min_free_disk_bytes": 20 * 1024 ** 3, "probe": probe,
        "checks": True}) + compat.problems({"host": host, "vllm_ascend_version": "0.25.1", "compat": probe["compat"]})
    assert got["problems"] == old and any("Docker engine not reachable" in p for p in old)
    assert got["docker_warnings"] == compat.docker_warnings(host, probe["compat"]) != []
    # without the compatibility checks neither the version row nor daemon.json is judged
    assert verdict.host_judgement(host, entry, probe, compat_on=False)["docker_warnings"] == []


def test_a_bad_free_disk_size_names_the_host_and_the_variable():
    with pytest.raises(PdError, match=r"a-d0: pd_prechecks_min_free_disk: "):
        verdict.host_judgement("a-d0", PLAN["hosts"]["a-d0"], {"docker": {"ok": True}}, min_free_disk="lots")


def test_a_clean_fleet_is_rolled_and_every_host_has_a_passing_verdict():
    found = verdict.fleet_verdict(PLAN, probes(), HOSTS, HOSTS, hccn=False)
    assert found["problems"] == [] and all(v == {"failed": False, "msg": []} for v in found["verdicts"].values())
    assert found["rollout"] == order.rollout_targets(PLAN, probes(), HOSTS)
    assert found["rollout"]["changed"] == ["cluster_a", "cluster_b"] and found["ping_targets"] == {}


def test_one_host_with_a_problem_stops_the_rollout_and_is_named_alone():
    found = verdict.fleet_verdict(PLAN, probes(**{"b-d0": settled_probe("b-d0", docker_ok=False)}), HOSTS, HOSTS,
                                  hccn=False)
    assert [h for h, v in found["verdicts"].items() if v["failed"]] == ["b-d0"]
    assert found["verdicts"]["b-d0"]["msg"].startswith("b-d0: Docker engine not reachable (connection refused)")
    assert found["rollout"] is None and found["problems"] == found["verdicts"]["b-d0"]["msg"].split("\n")


def test_a_host_that_could_not_be_read_is_its_one_problem():
    lost = {"unreachable": True, "msg": "ssh: connect to host b-d1 port 22: No route to host"}
    found = verdict.fleet_verdict(PLAN, probes(**{"b-d1": lost}), HOSTS, HOSTS, hccn=False)
    assert found["verdicts"]["b-d1"]["failed"]
    assert found["verdicts"]["b-d1"]["msg"].startswith("b-d1: unreachable: ssh: connect to host b-d1")
    failed = {"failed": True, "msg": "sudo: a password is required"}
    found = verdict.fleet_verdict(PLAN, probes(**{"a-p0": failed}), HOSTS, HOSTS, hccn=False)
    assert "a-p0: its probe failed: sudo: a password is required" in found["verdicts"]["a-p0"]["msg"]


def test_no_rollout_without_every_host_or_after_a_failed_pull():
    left = verdict.fleet_verdict(PLAN, probes(), HOSTS[:-1], HOSTS, hccn=False)
    assert left["rollout"] is None and left["problems"] == []
    pulled = verdict.fleet_verdict(PLAN, probes(), HOSTS, HOSTS, pull_failed=True, hccn=False)
    assert pulled["rollout"] is None and pulled["problems"] == []


def test_a_half_deploying_tag_selection_is_the_first_hosts_problem():
    found = verdict.fleet_verdict(PLAN, probes(), HOSTS, HOSTS, hccn=False, run_tags=["engines"], skip_tags=[])
    assert found["problems"] and found["rollout"] is None
    assert [h for h, v in found["verdicts"].items() if v["failed"]] == [HOSTS[0]]
    assert found["fleet_problems"] == {HOSTS[0]: found["problems"]}
    decided = pd_prechecks_decide.decide(PLAN, probes(), HOSTS, HOSTS, hccn=False, run_tags=["engines"], skip_tags=[])
    assert decided["failed"] and decided["fleet_problems"] == found["fleet_problems"]
    # not judged while a host could not be read (what it runs is unknown)
    lost = verdict.fleet_verdict(PLAN, probes(**{"b-d1": {"unreachable": True, "msg": "gone"}}), HOSTS, HOSTS,
                                 hccn=False, run_tags=["engines"], skip_tags=[])
    assert not lost["verdicts"][HOSTS[0]]["failed"]


def test_the_decision_fails_with_every_problem_then_the_warnings():
    warned = settled_probe("a-d0")
    warned["docker_warnings"] = ["a-d0: Docker's log driver has no log-opts max-size"]
    bad = settled_probe("b-d0", docker_ok=False)
    out = pd_prechecks_decide.decide(PLAN, probes(**{"a-d0": warned, "b-d0": bad}), HOSTS, HOSTS, hccn=False)
    assert out["failed"] and out["hosts"] == ["b-d0"] and "ansible_facts" not in out
    # each host's problems are printed once, in msg (its own are in its pd_host_check result)
    assert "verdicts" not in out and out["fleet_problems"] == {}
    assert out["msg"].split("\n") == bad["problems"] + ["WARNING a-d0: Docker's log driver has no log-opts max-size"]
    ok = pd_prechecks_decide.decide(PLAN, probes(**{"a-d0": warned}), HOSTS, HOSTS, hccn=False)
    assert not ok.get("failed") and ok["warnings_found"] == warned["docker_warnings"]
    assert ok["ansible_facts"]["pd_prechecks_rollout"]["changed"] == ["cluster_a", "cluster_b"]
    assert ok["ansible_facts"]["pd_prechecks_hccn_ping_targets"] == {}
    assert ok["msg"] == "to roll: cluster_a, cluster_b; left as they are: none"


def test_the_host_check_refuses_bad_arguments_with_the_fix():
    good = {"host_plan": copy.deepcopy(PLAN["hosts"]["a-p0"]), "docker_socket": "/var/run/docker.sock"}
    assert pd_host_check.options(good)["probe_timeout"] == 15
    with pytest.raises(ValueError, match="host_plan: expected this host's entry of the fleet plan"):
        pd_host_check.options(dict(good, host_plan="a-p0"))
    with pytest.raises(ValueError, match="skip: 'maybe' is not a boolean"):
        pd_host_check.options(dict(good, skip="maybe"))
    with pytest.raises(ValueError, match="probe_timeout: 'soon' is not a whole number of seconds"):
        pd_host_check.options(dict(good, probe_timeout="soon"))


def _prechecks_spec():
    from pathlib import Path

    import yaml
    repo = Path(__file__).resolve().parents[5]
    specs = yaml.safe_load((repo / "roles/pd_prechecks/meta/argument_specs.yml").read_text())["argument_specs"]
    tasks = yaml.safe_load((repo / "roles/pd_prechecks/tasks/main.yml").read_text())
    plays = yaml.safe_load((repo / "playbooks/prechecks.yml").read_text())
    return specs["main"]["options"], tasks, plays


def test_the_role_options_are_checked_in_the_probe_task_when_the_include_skips_ansibles_check():
    options, tasks, plays = _prechecks_spec()
    assert controller.checked_options(options, {"pd_prechecks_probe_timeout": 20, "pd_prechecks_skip": False})[0] == []
    errors = controller.checked_options(options, {"pd_prechecks_probe_timeout": "soon", "pd_prechecks_hccn": "maybe"})[0]
    assert len(errors) == 2 and any("pd_prechecks_probe_timeout" in e for e in errors)
    assert any("pd_prechecks_hccn" in e for e in errors)
    # the playbook leaves Ansible's argument check out only because the role's first task does it
    include = next(t["ansible.builtin.include_role"] for p in plays for t in p.get("tasks") or []
                   if "ansible.builtin.include_role" in t and t["ansible.builtin.include_role"]["name"] == "pd.deploy.pd_prechecks")
    assert include.get("rolespec_validate") is False
    assert tasks[0]["pd.deploy.pd_host_check"]["check_role_options"] == "main"


def test_the_npus_a_host_needs_are_its_distinct_davinci_devices():
    specs = [{"devices": ["/dev/davinci0:/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager", "/dev/hisi_hdc"]},
             {"devices": ["/dev/davinci1", "/dev/davinci12:/dev/davinci12"]}, {}]
    assert prechecks.npus_needed(specs) == 3   # davinci0, davinci1 (twice, counted once), davinci12
    # the example fleet's decode host runs ranks on all 8 of its NPUs (pd_npus: 8)
    entry = PLAN["hosts"]["a-d0"]
    assert entry["npus"] == 8 and prechecks.npus_needed(containers.host_specs(entry)) == 8


def test_a_refused_variable_is_a_problem_of_the_inventory_not_a_lost_host():
    refused = {"failed": True, "msg": "Validation of arguments failed: ...",
               "argument_errors": ["argument 'pd_prechecks_probe_timeout' is of type str and we were unable to "
                                   "convert to int"]}
    found = verdict.fleet_verdict(PLAN, probes(**{"b-p0": refused}), HOSTS, HOSTS, hccn=False)
    assert found["rollout"] is None and found["verdicts"]["b-p0"]["failed"]
    line = found["verdicts"]["b-p0"]["msg"]
    assert line.startswith("b-p0: argument 'pd_prechecks_probe_timeout' is of type str")
    assert "fix that variable (inventory or -e" in line and "its probe failed" not in line
