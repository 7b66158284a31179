"""issue 21 "fail closed, round 3" through the real validate playbook, on broken copies of
inventories/example: what only Ansible can show (duplicate YAML keys in hosts.yml, group_vars and
host_vars; where a value comes from: the inventory or -e, vaulted or clear) and one case per new class
end to end. All runs start together once per module.
"""

import os
import re
import shutil
import subprocess

import pytest

from pd_render_helpers import BIN, REPO, assert_no_traceback, files_under, run_playbooks

pytestmark = pytest.mark.ansible

EXAMPLE = f"{REPO}/inventories/example"
VAULT_PASS = os.path.join(REPO, "tests", "fixtures", "secrets", "vault-pass.txt")
KEY = "sk-pd-round3-test-0f1e2d3c4b5a69788796a5b4"


def _replace(path, old, new):
    body = path.read_text(encoding="utf-8")
    assert old in body, (path, old)
    path.write_text(body.replace(old, new, 1), encoding="utf-8")


def _append(path, text):
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def dup_in_hosts(inv):
    # line 9 of the copy: ansible_user written twice under all.vars
    _replace(inv / "hosts.yml", "    ansible_user: root\n", "    ansible_user: root\n    ansible_user: admin\n")


def dup_in_group_vars(inv):
    _replace(inv / "group_vars" / "cluster_b.yml", "    port: 8000\n", "    port: 8000\n    port: 8001\n")


def dup_in_host_vars(inv):
    # the same value twice: nothing else in the plan changes, the duplicate alone must stop the run
    _append(inv / "host_vars" / "b-d1.yml", "pd_npus: 8\n")


def recompute_via_additional_config(inv):
    # cluster_a's prefill engine block gets additional_config with the decode-only key
    _replace(inv / "group_vars" / "cluster_a.yml", "      prefix_cache_retention_interval: 4096\n",
             "      prefix_cache_retention_interval: 4096\n      additional_config:\n        scheduler_config:\n"
             "          recompute_scheduler_enable: true\n")


def env_value_with_newline(inv):
    _replace(inv / "group_vars" / "cluster_a.yml", "  decode:\n",
             '  decode:\n    env:\n      MY_TUNING: "1\\nEVIL=2"\n')


def relative_lock_dir(inv):
    _append(inv / "group_vars" / "cluster_b.yml", "pd_deploy_lock_dir: pd-locks\n")


def break_lock_kept(inv):
    _append(inv / "group_vars" / "cluster_b.yml", "pd_deploy_break_lock: true\n")


def clear_api_key(inv):
    _append(inv / "group_vars" / "cluster_b.yml", f"pd_api_key: {KEY}\n")


def vaulted_api_key(home):
    def apply(inv):
        vaulted = subprocess.run(
            [os.path.join(BIN, "ansible-vault"), "encrypt_string", "--vault-password-file", VAULT_PASS,
             "--name", "pd_api_key", KEY], cwd=REPO, capture_output=True, text=True, check=True,
            env=dict(os.environ, ANSIBLE_HOME=str(home)))
        _append(inv / "group_vars" / "cluster_b.yml", vaulted.stdout)
    return apply


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    cases = {
        "dup_hosts": ([dup_in_hosts], []),
        "dup_group_vars": ([dup_in_group_vars], []),
        "dup_host_vars": ([dup_in_host_vars], []),
        "recompute_via_additional_config": ([recompute_via_additional_config], []),
        "env_value_with_newline": ([env_value_with_newline], []),
        "relative_lock_dir": ([relative_lock_dir], []),
        "break_lock_kept": ([break_lock_kept], []),
        "break_lock_given": ([], ["-e", "pd_deploy_break_lock=true"]),
        "clear_api_key": ([clear_api_key], []),
        "vaulted_api_key": ([vaulted_api_key(ansible_home)], ["--vault-password-file", VAULT_PASS]),
    }
    jobs, builds, invs = {}, {}, {}
    for key, (edits, extra) in cases.items():
        work = tmp_path_factory.mktemp(re.sub(r"\W", "_", key))
        inv = work / "inventory"
        shutil.copytree(EXAMPLE, inv)
        for edit in edits:
            edit(inv)
        builds[key], invs[key] = work / "build", inv
        jobs[key] = ["playbooks/validate.yml", "-i", str(inv), "-e", f"pd_plan_build_dir={builds[key]}", *extra]
    results = run_playbooks(jobs, ansible_home)
    return {key: (results[key], builds[key], invs[key]) for key in jobs}


def lines(run):
    return [re.sub(r"\s+", " ", line) for line in run.output.splitlines()]


def has_line(run, *parts):
    return any(all(p in line for p in parts) for line in lines(run))


@pytest.mark.parametrize("key, where", [
    ("dup_hosts", "hosts.yml:9:5"),
    ("dup_group_vars", "group_vars/cluster_b.yml:22:5"),
    ("dup_host_vars", "host_vars/b-d1.yml:7:1"),
])
def test_a_duplicate_yaml_key_stops_the_run_naming_file_and_line(runs, key, where):
    run, build, inv = runs[key]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "duplicate mapping key" in run.output.lower() and f"{inv}/{where}" in run.output, str(run)
    assert files_under(build) == []


@pytest.mark.parametrize("key, parts", [
    ("recompute_via_additional_config",
     ("ERROR cluster_a/prefill: prefill.engine.additional_config.scheduler_config.recompute_scheduler_enable: ",
      "set pd_cluster.prefill.recompute_scheduler instead")),
    ("env_value_with_newline", ("ERROR cluster_a: decode.env.MY_TUNING: '1\\nEVIL=2' holds a line break",)),
    ("relative_lock_dir", ("ERROR b-p0, b-d0, b-d1: pd_deploy_lock_dir: 'pd-locks' is not an absolute path",
                           "/var/lib/pd-deploy/locks")),
])
def test_the_new_classes_are_refused_end_to_end(runs, key, parts):
    run, build, _ = runs[key]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "no host was touched" in run.output and has_line(run, *parts), str(run)
    assert files_under(build) == []


def test_a_break_lock_kept_in_group_vars_is_a_warning_naming_the_file(runs):
    run, _, inv = runs["break_lock_kept"]
    assert run.rc == 0, str(run)
    assert has_line(run, "WARNING inventory: pd_deploy_break_lock: is true in "
                    f"{inv}/group_vars/cluster_b.yml", "-e pd_deploy_break_lock=true"), str(run)


def test_a_break_lock_given_with_e_is_no_warning(runs):
    run, _, _ = runs["break_lock_given"]
    assert run.rc == 0, str(run)
    assert "pd_deploy_break_lock" not in run.output, str(run)


def test_a_clear_api_key_in_group_vars_is_a_warning_and_a_vaulted_one_is_not(runs):
    clear, _, inv = runs["clear_api_key"]
    vaulted, _, _ = runs["vaulted_api_key"]
    assert clear.rc == 0 and vaulted.rc == 0, (str(clear), str(vaulted))
    assert has_line(clear, f"WARNING cluster_b: pd_api_key: the API key is written in clear in "
                    f"{inv}/group_vars/cluster_b.yml", "ansible-vault encrypt_string"), str(clear)
    assert "written in clear" not in vaulted.output, str(vaulted)
    assert KEY not in clear.output and KEY not in vaulted.output
