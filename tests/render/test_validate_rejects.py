"""Broken copies of inventories/example through the real playbooks: each is refused before any host
is touched, with a message naming where, the field and the fix, no traceback, and nothing written.

All runs start together once per module (each takes about a second; they are independent).
"""

import re
import shutil

import pytest
import yaml

from pd_render_helpers import REPO, assert_no_traceback, files_under, run_playbooks

pytestmark = pytest.mark.ansible

EXAMPLE = f"{REPO}/inventories/example"


# ---- inventory edits ----------------------------------------------------------------------------

def edit_yaml(path, change):
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    change(data)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)


def cluster_edit(cluster, change):
    def apply(inv):
        edit_yaml(inv / "group_vars" / f"{cluster}.yml", lambda d: change(d["pd_cluster"]))
    return apply


def recompute_on_prefill(c):
    c["prefill"]["recompute_scheduler"] = True


def gmu_096_on_decode(c):
    c["decode"]["engine"]["gpu_memory_utilization"] = 0.96


def typo_block_size(c):
    c["prefill"]["engine"]["blok_size"] = c["prefill"]["engine"].pop("block_size")


def kv_port_20000_on_decode(c):
    c["decode"]["kv_port"] = 20000


def shm_below_pinned(c):
    c["decode"]["shm_size"] = "64GiB"     # pinned per decode container: 200GiB / 8 x 4 = 100GiB


def name_mismatch(c):
    c["name"] = "cluster_x"


def port_base_as_float(c):
    c["prefill"]["port_base"] = 8000.0   # the proxy listens on 8000; rendered it was --port 8000.0


def max_model_len_beyond_model(c):
    c["decode"]["engine"]["max_model_len"] = 100000000


def max_num_seqs_astronomical(c):
    c["decode"]["engine"]["max_num_seqs"] = 10 ** 15


def no_host_ram(inv):
    edit_yaml(inv / "host_vars" / "a-d0.yml", lambda d: d.pop("pd_host_ram"))


def no_role_group(inv):
    edit_yaml(inv / "hosts.yml", lambda d: d["all"]["children"]["decode"]["hosts"].pop("b-d1"))


# key -> (edits, [(expected substrings of one violation line)])
CASES = {
    "recompute_scheduler_on_prefill": (
        [cluster_edit("cluster_a", recompute_on_prefill)],
        [("ERROR cluster_a/prefill: prefill.recompute_scheduler: ", "set prefill.recompute_scheduler: false")]),
    "gpu_memory_utilization_0.96": (
        [cluster_edit("cluster_a", gmu_096_on_decode)],
        [("ERROR cluster_a/decode: decode.engine.gpu_memory_utilization: 0.96", "0.85")]),
    "typo_key": (
        [cluster_edit("cluster_b", typo_block_size)],
        [("ERROR cluster_b: prefill.engine.blok_size: ", "remove or rename the key")]),
    "kv_port_20000_on_8_npu_host": (
        [cluster_edit("cluster_a", kv_port_20000_on_decode)],
        # the image's Mooncake 0.3.11.post1 draws 20000 + id x 100 .. 20000 + (id + 1) x 100 per NPU,
        # top included: NPUs 0..7 -> 20000..20800
        [("ERROR cluster_a/decode", "@a-d0: decode.kv_port: ", "20000", "kv_port >= 20801")]),
    "shm_below_pinned_offload": (
        [cluster_edit("cluster_a", shm_below_pinned)],
        # 100GiB pinned x 1.28 = 128GiB
        [("ERROR cluster_a/decode", ": decode.shm_size: ", "at least 128GiB")]),
    "pd_cluster_name_mismatch": (
        [cluster_edit("cluster_b", name_mismatch)],
        # one value of group_vars read by three hosts: reported once, naming them
        [("ERROR b-p0, b-d0, b-d1: pd_cluster.name: 'cluster_x'", "set pd_cluster.name to the cluster's group name")]),
    "host_in_no_role_group": (
        [no_role_group],
        [("ERROR b-d1: groups: host is in neither", "exactly one of the groups 'prefill' and 'decode'")]),
    # issue 21: numbers of the wrong type, values no engine takes, a root cause without its cascade
    "port_base_as_float": (
        [cluster_edit("cluster_a", port_base_as_float)],
        [("ERROR cluster_a: prefill.port_base: 8000.0 is a float", "write 8000")]),
    "max_model_len_beyond_the_model": (
        [cluster_edit("cluster_a", max_model_len_beyond_model)],
        [("ERROR cluster_a/decode: decode.engine.max_model_len: 100000000 is beyond the context", "at most 1048576")]),
    "max_num_seqs_astronomical": (
        [cluster_edit("cluster_a", max_num_seqs_astronomical)],
        [("ERROR cluster_a/decode: decode.engine.max_num_seqs: 1000000000000000 sequences", "at most")]),
    "host_ram_missing": (
        [no_host_ram],
        [("ERROR a-d0: pd_host_ram: missing", "set pd_host_ram")]),
    "three_at_once": (
        [cluster_edit("cluster_a", recompute_on_prefill), cluster_edit("cluster_a", gmu_096_on_decode),
         cluster_edit("cluster_b", typo_block_size)],
        [("ERROR cluster_a/prefill: prefill.recompute_scheduler: ", "set prefill.recompute_scheduler: false"),
         ("ERROR cluster_a/decode: decode.engine.gpu_memory_utilization: 0.96", "0.85"),
         ("ERROR cluster_b: prefill.engine.blok_size: ", "remove or rename the key")]),
}
DEPLOY_CASE = "gpu_memory_utilization_0.96"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    jobs, builds = {}, {}
    for key, (edits, _) in list(CASES.items()) + [("valid", ([], []))]:
        work = tmp_path_factory.mktemp(re.sub(r"\W", "_", key))
        inv = work / "inventory"
        shutil.copytree(EXAMPLE, inv)
        for edit in edits:
            edit(inv)
        builds[key] = work / "build"
        jobs[key] = ["playbooks/validate.yml", "-i", str(inv), "-e", f"pd_plan_build_dir={builds[key]}"]
        if key == DEPLOY_CASE:
            builds["deploy"] = work / "deploy-build"
            jobs["deploy"] = ["playbooks/deploy_pd.yml", "-i", str(inv), "-e", "pd_render_only=true",
                              "-e", f"pd_plan_build_dir={builds['deploy']}"]
    results = run_playbooks(jobs, ansible_home)
    return {key: (results[key], builds[key]) for key in jobs}


def one_line(text):
    return re.sub(r"\s+", " ", text)


def assert_refused(run, build, expected):
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "no host was touched" in run.output, str(run)
    text = one_line(run.output)
    lines = [one_line(line) for line in run.output.splitlines()]
    for parts in expected:
        # every part of one violation appears together on one output line
        assert any(all(p in line for p in parts) for line in lines), f"{parts} not in:\n{text[-4000:]}"
    assert files_under(build) == [], f"something was written: {files_under(build)}"


@pytest.mark.parametrize("key", sorted(CASES))
def test_validate_refuses_the_broken_inventory(runs, key):
    run, build = runs[key]
    assert_refused(run, build, CASES[key][1])


def test_three_breaks_are_reported_in_one_run(runs):
    run, _ = runs["three_at_once"]
    head = re.search(r"The inventory breaks (\d+) rule\(s\)", run.output)
    assert head and int(head.group(1)) >= 3, str(run)


def test_render_only_deploy_of_a_broken_inventory_renders_nothing(runs):
    run, build = runs["deploy"]
    assert_refused(run, build, CASES[DEPLOY_CASE][1])
    # refused in the validate play: no later play had a host but the report's and the closing failure's, and
    # the report says why instead of "launch specs written"
    assert re.search(r"PLAY \[Check every host before any is touched\][^\n]*\n\s*skipping: no hosts matched", run.output)
    assert "pd.deploy.pd_rollout :" not in run.output and "Render-only: launch specs written" not in run.output
    assert "DEPLOY REFUSED BY VALIDATE: the inventory breaks" in run.output
    assert "The deploy was refused by validate" in run.output


def test_the_unbroken_copy_passes_and_writes_its_plan(runs):
    # the control case: same copy, same flags, nothing broken -> rc 0 and a plan on disk,
    # so the "nothing was written" checks above can tell the difference
    run, build = runs["valid"]
    assert run.rc == 0, str(run)
    assert_no_traceback(run)
    written = files_under(build)
    assert "plan.json" in written and "render/cluster_a/capacity.md" in written


@pytest.mark.parametrize("key", ["max_num_seqs_astronomical", "host_ram_missing", "port_base_as_float"])
def test_the_root_cause_is_the_only_error(runs, key):
    """issue 21: no consequence of it (decode hosts (none) have 0 usable, an EiB reserve, the batched-tokens rule)."""
    run, _ = runs[key]
    head = re.search(r"The inventory breaks (\d+) rule\(s\)", run.output)
    assert head and int(head.group(1)) == 1, str(run)
    assert "EiB" not in run.output and "have 0 usable" not in run.output
