"""issue 12 "fail closed" through the real playbooks: an inventory that cannot be read or holds no
cluster exits non-zero (it printed "no hosts matched" and exited 0), the embedded demo inventory never
deploys, YAML errors name file and line, a mistyped switch is refused, each violation is printed once.
"""

import re
import shutil

import pytest

from pd_render_helpers import REPO, assert_no_traceback, files_under, run_playbooks

pytestmark = pytest.mark.ansible

EXAMPLE = f"{REPO}/inventories/example"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    work = tmp_path_factory.mktemp("failclosed")
    no_cluster = work / "no_cluster"
    no_cluster.mkdir()
    (no_cluster / "hosts.yml").write_text("all:\n  hosts:\n    somehost:\n")
    broken_yaml = work / "broken_yaml"
    shutil.copytree(EXAMPLE, broken_yaml)
    text = (broken_yaml / "group_vars" / "cluster_b.yml").read_text()
    # an indentation error on line 3 of the file: "  name:" becomes "   name:" after a key
    (broken_yaml / "group_vars" / "cluster_b.yml").write_text(
        text.replace("pd_cluster:\n  name: cluster_b\n", "pd_cluster:\n  name: cluster_b\n   image: x\n", 1))
    three = work / "three"
    shutil.copytree(EXAMPLE, three)
    gv = three / "group_vars" / "cluster_a.yml"
    gv.write_text(gv.read_text().replace("gpu_memory_utilization: 0.85", "gpu_memory_utilization: 0.97")
                  .replace("prefix_cache_retention_interval: 4096", "prefix_cache_retention_interval: 4000"))
    build = work / "build"
    jobs = {
        "missing_path": ["playbooks/validate.yml", "-i", str(work / "no-such-dir")],
        "no_cluster_validate": ["playbooks/validate.yml", "-i", str(no_cluster)],
        "no_cluster_deploy": ["playbooks/deploy_pd.yml", "-i", str(no_cluster)],
        "local_deploy": ["playbooks/deploy_pd.yml", "-e", f"pd_plan_build_dir={build}/local"],
        "local_render": ["playbooks/deploy_pd.yml", "-e", "pd_render_only=true", "-e", f"pd_plan_build_dir={build}/r"],
        "broken_yaml": ["playbooks/validate.yml", "-i", str(broken_yaml), "-e", f"pd_plan_build_dir={build}/y"],
        "typo_switch": ["playbooks/deploy_pd.yml", "-i", EXAMPLE, "-e", "pd_render_onyl=true",
                        "-e", f"pd_plan_build_dir={build}/t"],
        "three": ["playbooks/validate.yml", "-i", str(three), "-e", f"pd_plan_build_dir={build}/3"],
        "local_validate": ["validate.yml", "-e", f"pd_plan_build_dir={build}/v"],
        "bad_batch": ["playbooks/deploy_pd.yml", "-i", EXAMPLE, "-e", "pd_cluster_batch=0",
                      "-e", f"pd_plan_build_dir={build}/b"],
    }
    return run_playbooks(jobs, ansible_home), build


def flat(run):
    return re.sub(r"\s+", " ", run.output)


def test_a_mistyped_inventory_path_fails(runs):
    run = runs[0]["missing_path"]
    assert run.rc != 0, str(run)
    assert "no-such-dir" in run.output


@pytest.mark.parametrize("key", ["no_cluster_validate", "no_cluster_deploy"])
def test_an_inventory_without_clusters_fails_with_a_message(runs, key):
    run = runs[0][key]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "holds no cluster" in flat(run) and "-i inventories/<fleet>" in flat(run)


def test_the_embedded_inventory_never_deploys_but_renders(runs):
    run, build = runs[0]["local_deploy"], runs[1]
    assert run.rc != 0, str(run)
    assert "embedded demo inventory" in flat(run) and "pd_render_only=true" in flat(run)
    # no host probed: the deploy went on past the refusal only to report it (issue 23 item 6), the prechecks
    # play matched no host
    assert re.search(r"PLAY \[Check every host before any is touched\][^\n]*\n\s*skipping: no hosts matched", run.output)
    assert "Read the host in one probe" not in run.output
    assert files_under(build / "local") == []
    rendered = runs[0]["local_render"]
    assert rendered.rc == 0, str(rendered)


def test_a_yaml_error_in_group_vars_names_file_and_line(runs):
    run = runs[0]["broken_yaml"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    lines = (runs[1].parent / "broken_yaml" / "group_vars" / "cluster_b.yml").read_text().splitlines()
    line = lines.index("   image: x") + 1
    assert re.search(rf"group_vars/cluster_b\.yml:{line}:\d+", flat(run)), str(run)


def test_the_vars_plugin_loads_without_a_warning(runs):
    # pd.deploy.pd_group_vars extends the built-in host_group_vars, whose REQUIRES_ENABLED made ansible-core
    # warn on every run once the plugin came from the collection ("REQUIRES_ENABLED is not supported")
    rendered = runs[0]["local_render"]
    assert rendered.rc == 0, str(rendered)
    assert "REQUIRES_ENABLED" not in rendered.output and "pd_group_vars" not in rendered.output, str(rendered)


def test_a_mistyped_switch_is_refused_before_anything_runs(runs):
    # -e pd_render_onyl=true used to be ignored: the deploy went ahead for real
    run = runs[0]["typo_switch"]
    assert run.rc != 0, str(run)
    assert "pd_render_onyl" in run.output and "pd_render_only" in run.output
    # no host was probed: the prechecks play matched none (the deploy went on only to report and fail)
    assert "Read the host in one probe" not in run.output
    assert re.search(r"PLAY \[Check every host before any is touched\][^\n]*\n\s*skipping: no hosts matched", run.output)


def test_each_violation_is_printed_once(runs):
    run = runs[0]["three"]
    assert run.rc != 0, str(run)
    for needle in ("prefill.engine.gpu_memory_utilization: 0.97", "prefill.engine.prefix_cache_retention_interval: 4000"):
        count = sum(needle in line for line in run.output.splitlines())
        assert count == 1, f"{needle!r} printed {count} times:\n{run.output[-4000:]}"


def test_validate_without_i_says_it_checked_the_embedded_demo_inventory(runs):
    """issue 21: it printed ok for inventories/local without saying that was the inventory it checked."""
    run = runs[0]["local_validate"]
    assert run.rc == 0, str(run)
    text = flat(run)
    assert re.search(r"Checking the inventory \S*inventories/local \(2 cluster host\(s\)\): the embedded demo "
                     r"inventory", text), text[-3000:]
    assert "-i inventories/<fleet>" in text


def test_a_fleet_inventory_is_named_and_not_called_the_demo(runs):
    run = runs[0]["three"]
    text = flat(run)
    assert "Checking the inventory " in text and "/three (" in text, text[-3000:]
    assert "embedded demo inventory" not in text


def test_a_bad_cluster_batch_is_refused_before_any_host_is_probed(runs):
    run = runs[0]["bad_batch"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "pd_cluster_batch: '0' is neither a number of clusters" in flat(run)
    assert "-e pd_cluster_batch=N" in flat(run)
    assert "Read which containers" not in run.output and "pd_prechecks" not in run.output
