"""pd_host_check's check of its role's variables in a real ansible-playbook run (playbooks/prechecks.yml
includes pd_prechecks with rolespec_validate false: this task is the role's argument check). The check
comes before the probe, so no host or Docker is needed: a bad variable stops the task with Ansible's
own message, a good set goes on to the probe (which then fails here: no Docker socket at that path)."""

import pytest

from tests.fixtures.json_play import run_json_play


@pytest.mark.ansible
def test_a_bad_prechecks_variable_is_refused_before_the_probe_with_ansibles_message(tmp_path):
    plan = {"hosts": {"localhost": {"docker_socket": str(tmp_path / "no-docker.sock"), "specs": [], "proxy": None,
                                    "model_path": str(tmp_path), "cluster": "c", "ram_reserve_bytes": 0,
                                    "npu_chip": "", "hbm_per_npu_bytes": 0}},
            "clusters": {"c": {"vllm_ascend_version": "0.25.1"}}}
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"pd_plan_fleet": plan}},
        {"ansible.builtin.include_role": {"name": "pd.deploy.pd_prechecks", "rolespec_validate": False}}]}]

    def run(*extra):
        tasks = run_json_play(tmp_path, play, "-e", "pd_prechecks_hccn=false", *extra)["plays"][0]["tasks"]
        return next(t for t in tasks if "Read the host in one probe" in t["task"]["name"])["hosts"]["localhost"]

    bad = run("-e", "pd_prechecks_probe_timeout=soon", "-e", "pd_prechecks_compat=maybe")
    assert bad["failed"] and bad["msg"].startswith("Validation of arguments failed:")
    errors = "\n".join(bad["argument_errors"])
    assert "pd_prechecks_probe_timeout" in errors and "pd_prechecks_compat" in errors
    assert "docker" not in bad  # refused before the probe ran
    good = run("-e", "pd_prechecks_skip=true")
    # the variables passed; the probe ran and found no Docker engine at the socket (read, judged, a problem)
    assert not good.get("argument_errors") and good["docker"]["ok"] is False
    assert any("Docker engine not reachable" in p for p in good["problems"])
