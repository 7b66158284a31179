"""issue 23 items 4-6 through the real playbooks: tags and the prechecks entry point, --check writes
nothing, and the closing report after a precheck failure, an unreachable host, a validate refusal and a
failed image pull
(names the problems, lists no container as if it ran), printed as lines and kept in the run's custom
stats (AWX artifacts), the run failed after it.

The fleet is inventories/example with every host reached over the local connection and a Docker socket
that does not exist (every host fails its prechecks: no engine), one host on 127.0.0.1 port 1 (refused:
unreachable), one cluster's cpu_offload not a size (validate refuses), or one cluster's images pulled
(pd_image_pull missing: the pull fails at the missing socket). Nothing but 127.0.0.1 is
contacted and no container is started.
"""

import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from pd_render_helpers import REPO, _env, _run_one, assert_no_traceback, files_under

pytestmark = pytest.mark.ansible

EXAMPLE = f"{REPO}/inventories/example"
LOGIN_PASSWORD = "not-the-registry-password-4711"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    work = tmp_path_factory.mktemp("workflow")
    inv = work / "prod"
    shutil.copytree(EXAMPLE, inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["vars"] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                            "pd_docker_socket": str(work / "no-docker.sock")}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    # the same fleet with b-d1 unreachable
    lost_inv = work / "lost"
    shutil.copytree(inv, lost_inv)
    lost = yaml.safe_load((lost_inv / "host_vars" / "b-d1.yml").read_text()) or {}
    lost.update({"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
                 "ansible_ssh_common_args": "-o ConnectTimeout=5 -o BatchMode=yes"})
    (lost_inv / "host_vars" / "b-d1.yml").write_text(yaml.safe_dump(lost))
    # the same fleet with a rule broken: cluster_a's decode cpu_offload is not a size
    bad_inv = work / "bad"
    shutil.copytree(inv, bad_inv)
    bad = yaml.safe_load((bad_inv / "group_vars" / "cluster_a.yml").read_text())
    bad["pd_cluster"]["decode"]["cpu_offload"] = "lots"
    (bad_inv / "group_vars" / "cluster_a.yml").write_text(yaml.safe_dump(bad))
    # the same fleet with cluster_b's images pulled (pd_image_pull missing): the pull fails at the socket
    pull_inv = work / "pull"
    shutil.copytree(inv, pull_inv)
    pulled = yaml.safe_load((pull_inv / "group_vars" / "cluster_b.yml").read_text())
    pulled["pd_image_pull"] = "missing"
    (pull_inv / "group_vars" / "cluster_b.yml").write_text(yaml.safe_dump(pulled))
    # the same with a registry login (issue 23 item 6): it fails at the missing socket, nothing is pulled
    login_inv = work / "login"
    shutil.copytree(pull_inv, login_inv)
    login = yaml.safe_load((login_inv / "group_vars" / "cluster_b.yml").read_text())
    login.update({"pd_image_registry": "127.0.0.1:5000", "pd_image_registry_username": "ci",
                  "pd_image_registry_password": LOGIN_PASSWORD})
    (login_inv / "group_vars" / "cluster_b.yml").write_text(yaml.safe_dump(login))
    # an inventory without a cluster
    empty_inv = work / "empty"
    empty_inv.mkdir()
    (empty_inv / "hosts.yml").write_text("all:\n  hosts:\n    somehost:\n")
    build = work / "build"
    jobs = {
        "list_tags": ["deploy-pd.yml", "-i", str(inv), "--list-tags"],
        "list_prechecks": ["deploy-pd.yml", "-i", str(inv), "--list-tasks", "--tags", "prechecks"],
        "list_pull": ["deploy-pd.yml", "-i", str(inv), "--list-tasks", "--tags", "pull"],
        "prechecks": ["prechecks.yml", "-i", str(inv), "-e", f"pd_plan_build_dir={build}/p"],
        "deploy": ["deploy-pd.yml", "-i", str(inv), "-e", f"pd_plan_build_dir={build}/d"],
        "deploy_lost": ["deploy-pd.yml", "-i", str(lost_inv), "-e", f"pd_plan_build_dir={build}/l"],
        "deploy_invalid": ["deploy-pd.yml", "-i", str(bad_inv), "-e", f"pd_plan_build_dir={build}/v"],
        "deploy_pull": ["deploy-pd.yml", "-i", str(pull_inv), "-e", f"pd_plan_build_dir={build}/u",
                        "-e", "pd_image_pull_poll=1"],
        "deploy_batch": ["deploy-pd.yml", "-i", str(inv), "-e", "pd_cluster_batch=0", "-e", f"pd_plan_build_dir={build}/b"],
        "deploy_demo": ["deploy-pd.yml", "-e", f"pd_plan_build_dir={build}/demo"],
        "deploy_empty": ["deploy-pd.yml", "-i", str(empty_inv), "-e", f"pd_plan_build_dir={build}/e"],
        "deploy_login": ["deploy-pd.yml", "-i", str(login_inv), "-e", f"pd_plan_build_dir={build}/g",
                         "-e", "pd_image_pull_poll=1"],
        "check_render": ["deploy-pd.yml", "-i", EXAMPLE, "-e", "pd_render_only=true", "--check", "--diff",
                         "-e", f"pd_plan_build_dir={build}/c"],
    }
    env = _env(str(ansible_home))
    env["ANSIBLE_SHOW_CUSTOM_STATS"] = "true"
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(_run_one, args, env) for key, args in jobs.items()}
        return {key: f.result() for key, f in futures.items()}, build


def test_list_tags_shows_the_documented_tags(runs):
    run = runs[0]["list_tags"]
    assert run.rc == 0, str(run)
    listed = set()
    for found in re.findall(r"TAGS: \[([^\]]*)\]", run.output):
        listed |= {t.strip() for t in found.split(",") if t.strip()}
    assert {"always", "prechecks", "engines", "proxy", "report"} <= listed, run.output


def test_tags_prechecks_lists_validate_and_the_prechecks_only(runs):
    run = runs[0]["list_prechecks"]
    assert run.rc == 0, str(run)
    assert "Plan and check the whole fleet" in run.output
    assert "Run the prechecks and find what already runs" in run.output
    # the rollout's include is listed (always), but its play has no host unless engines or proxy are selected
    assert "Show the containers of each cluster" not in run.output
    assert "Fail the deploy that did not end" in run.output  # always: matches no host unless a rollout failed


def test_tags_pull_is_a_valid_selection_that_plans(runs):
    run = runs[0]["list_pull"]
    assert run.rc == 0, str(run)
    assert "Plan and check the whole fleet" in run.output
    assert "Run the prechecks and find what already runs" not in run.output


def test_prechecks_alone_validates_checks_every_host_and_touches_nothing_else(runs):
    run = runs[0]["prechecks"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert "TASK [pd.deploy.pd_plan : Plan and check the whole fleet]" in run.output
    assert "Read the host in one probe" in run.output and "no-docker.sock" in run.output
    assert "Roll out" not in run.output and "Take the deploy lock" not in run.output
    assert "DEPLOY" not in run.output


def _report(run):
    """The closing report's lines as printed: plain text under the report task's banner, one output line per
    report line (no JSON escapes, no YAML wrapping), before the task's "ok:"."""
    text = run.output.split("TASK [Show the containers of each cluster", 1)[1].split("\n", 1)[1]
    return [line for line in text.split("\nok: [", 1)[0].splitlines() if line.strip()]


def _stats(run):
    """The custom stats as ANSIBLE_SHOW_CUSTOM_STATS prints them (one YAML-ish run of text)."""
    assert "CUSTOM STATS" in run.output, run.output[-3000:]
    return " ".join(run.output.split("CUSTOM STATS", 1)[1].split())


def _closing_failure(run):
    """The message of the deploy's last task (the play that fails the run after the report)."""
    tail = run.output.split("TASK [Fail the deploy that did not end", 1)[1]
    return " ".join(tail.split("Task failed: Action failed: ", 1)[1].split("\n", 1)[0].split())


def test_a_deploy_stopped_by_its_prechecks_prints_every_hosts_problems_and_nothing_as_if_it_ran(runs):
    run = runs[0]["deploy"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    lines = _report(run)
    text = "\n".join(lines)
    assert lines[0].startswith("DEPLOY REFUSED BY THE PRECHECKS: no container was touched"), run.output[-4000:]
    assert lines[1] == "Problems found (fix each, then deploy again):", text
    for host in ("a-p0", "a-d0", "b-p0", "b-d0", "b-d1"):
        # the same text the failed check printed, in the report
        found = re.search(rf"(?m)^  {host}: Docker engine not reachable .*$", text)
        assert found and found.group(0).strip() in run.output.split("TASK [Show the containers", 1)[0], text
    assert lines[-2:] == ["cluster_a: not touched: the deploy stopped before its rollout",
                          "cluster_b: not touched: the deploy stopped before its rollout"]
    assert not any(re.search(r"^  pd-\S+ on \S+ port \d+", line) for line in lines), text
    # nothing rolled: the rollout play matched no host, no lock was taken
    assert "Take the deploy lock" not in run.output
    assert re.search(r"PLAY \[Roll out the clusters that change[^\n]*\n\s*skipping: no hosts matched", run.output)
    stats = _stats(run)
    assert "outcome: refused by the prechecks" in stats and "DEPLOY REFUSED BY THE PRECHECKS" in stats
    assert "cluster_b: not touched: the deploy stopped before its rollout" in stats
    assert _closing_failure(run).startswith(
        "The deploy was refused by the prechecks: problems on a-d0, a-p0, b-d0, b-d1, b-p0"), run.output[-2000:]


def test_a_deploy_stopped_by_an_unreachable_host_names_it_and_the_hosts_not_judged(runs):
    run = runs[0]["deploy_lost"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    lines = _report(run)
    text = "\n".join(lines)
    assert lines and lines[0].startswith("DEPLOY REFUSED BY THE PRECHECKS"), run.output[-4000:]
    lost = lines.index("Hosts that could not be read (bring them back, or leave their cluster out with --limit):")
    assert re.match(r"  b-d1: unreachable: .*127\.0\.0\.1", lines[lost + 1]), text
    # every other host was judged all the same (the unreachable one no longer stops their checks)
    assert not any(line.startswith("Not judged") for line in lines), text
    for host in ("a-p0", "a-d0", "b-p0", "b-d0"):
        assert re.search(rf"(?m)^  {host}: Docker engine not reachable", text), text
    assert "cluster_b: not touched: the deploy stopped before its rollout" in lines
    # no container listed as if it ran (the report listed each one on its port, with no state)
    assert not any(re.search(r"^  pd-\S+ on \S+ port \d+", line) for line in lines), text
    # the same report in the run's custom stats (an AWX job's artifacts), with its outcome
    stats = _stats(run)
    assert "pd_deploy_report" in stats and "outcome: refused by the prechecks" in stats
    assert "DEPLOY REFUSED BY THE PRECHECKS" in stats and "b-d1: unreachable:" in stats
    # printed once as text (the task's result, the stats, shows with -v only), once in the stats
    assert run.output.count("cluster_b: not touched: the deploy stopped before its rollout") == 2
    assert "problems on a-d0, a-p0, b-d0, b-d1, b-p0" in _closing_failure(run)


def test_a_deploy_whose_image_pull_failed_reports_the_pulls_and_rolls_nothing(runs):
    run = runs[0]["deploy_pull"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    # the pull ran on cluster_b's hosts only, its failure printed and ignored (the report comes after it)
    assert "TASK [pd.deploy.pd_image : Pull the images of this host's ranks" in run.output, run.output[-4000:]
    lines = _report(run)
    text = "\n".join(lines)
    assert lines[0].startswith("DEPLOY REFUSED BY THE IMAGE PULL: no container was touched"), run.output[-4000:]
    start = lines.index("Pulls that failed (fix the registry, the image reference or the credentials, then deploy again):")
    # the section's lines: up to the next heading (the prechecks' problems)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    failed = lines[start + 1:end]
    # cluster_b's hosts only (cluster_a's policy is never), each naming the reference and why
    assert sorted(line.split(":", 1)[0].strip() for line in failed) == ["b-d0", "b-d1", "b-p0"], text
    assert all(re.match(r"  b-\S+: quay\.io/ascend/vllm-ascend:v0\.25\.1rc1: Error connecting", line) for line in failed), text
    # the prechecks still judged every host (their problems follow), nothing was rolled
    assert lines[end] == "Problems found (fix each, then deploy again):", text
    assert lines[-2:] == ["cluster_a: not touched: the deploy stopped before its rollout",
                          "cluster_b: not touched: the deploy stopped before its rollout"]
    assert not any(re.search(r"^  pd-\S+ on \S+ port \d+", line) for line in lines), text
    assert "Take the deploy lock" not in run.output
    assert re.search(r"PLAY \[Roll out the clusters that change[^\n]*\n\s*skipping: no hosts matched", run.output)
    stats = _stats(run)
    assert "outcome: refused by the image pull" in stats and "DEPLOY REFUSED BY THE IMAGE PULL" in stats
    message = _closing_failure(run)
    assert re.match(r"The deploy was refused by the image pull: pulls failed on (b-\S+, ){2}b-\S+ listed", message) \
        or re.match(r"The deploy was refused by the image pull: pulls failed on (b-\S+, ){2}b-\S+, listed", message), message
    assert "docs/guide/pull.md" in message


def test_a_deploy_validate_refused_reports_the_rules_and_contacts_no_host(runs):
    run = runs[0]["deploy_invalid"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    lines = _report(run)
    assert lines[0] == "DEPLOY REFUSED BY VALIDATE: the inventory breaks 1 rule(s); no host was contacted and nothing was touched"
    assert re.match(r"  ERROR cluster_a: decode\.cpu_offload: cannot read 'lots' as a size — ", lines[2]), lines
    assert lines[-2:] == ["cluster_a: not touched: the deploy was refused before any host was contacted",
                          "cluster_b: not touched: the deploy was refused before any host was contacted"]
    # no host was probed: the prechecks (and the pull) matched none
    assert "Read the host in one probe" not in run.output
    assert re.search(r"PLAY \[Check every host before any is touched\][^\n]*\n\s*skipping: no hosts matched", run.output)
    stats = _stats(run)
    assert "outcome: refused by validate" in stats and "DEPLOY REFUSED BY VALIDATE" in stats
    assert _closing_failure(run).startswith("The deploy was refused by validate: the inventory breaks 1 rule(s)")


def test_check_mode_writes_no_file(runs):
    run, build = runs[0]["check_render"], runs[1]
    assert run.rc == 0, str(run)
    assert files_under(build / "c") == []
    assert "--check: nothing written" in run.output


# ---- issue 23 item 6: the refusals that ended without the report ----------------------------------

def _printed_refusal(run):
    """The text the check of the plan failed with (pd_plan_check), as its task printed it."""
    tail = run.output.split("TASK [pd.deploy.pd_plan : Stop before touching any host", 1)[1]
    return " ".join(tail.split("Task failed: Action failed: ", 1)[1].split("\nOrigin:", 1)[0].split())


@pytest.mark.parametrize("key, says", [
    ("deploy_batch", "deploy-pd.yml: pd_cluster_batch: '0' is neither a number of clusters"),
    ("deploy_demo", "inventories/local is the embedded demo inventory (pd_inventory_render_only)"),
    ("deploy_empty", "/empty holds no cluster: the group pd_clusters has no hosts."),
])
def test_a_run_validate_refused_ends_with_the_report_its_stats_and_the_same_message(runs, key, says):
    """A bad -e pd_cluster_batch and the embedded demo inventory failed at the check with no report and no
    custom stats (an AWX job kept nothing); no cluster reported the plan's rule, not the text printed."""
    run, build = runs[0][key], runs[1]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    printed = _printed_refusal(run)
    assert says in printed, printed
    assert "...ignoring" in run.output.split("TASK [pd.deploy.pd_plan : Stop before touching any host", 1)[1].split("PLAY [", 1)[0]
    lines = _report(run)
    assert lines[:2] == ["DEPLOY REFUSED BY VALIDATE: no host was contacted and nothing was touched",
                         "Why (fix it, then deploy again):"], run.output[-4000:]
    assert " ".join(lines[2].split()) == printed, lines
    assert all(line.endswith(": not touched: the deploy was refused before any host was contacted") for line in lines[3:])
    assert not any(re.search(r"^  pd-\S+ on \S+ port \d+", line) for line in lines)
    stats = _stats(run)
    assert "pd_deploy_report:" in stats and "outcome: refused by validate" in stats
    assert "DEPLOY REFUSED BY VALIDATE: no host was contacted" in stats
    # the run fails last with the text printed at the check
    assert _closing_failure(run) == f"The deploy was refused by validate (no host was contacted): {printed}"
    # nothing touched: no host pulled, probed or rolled, no file written
    for play in ("Pull the clusters' images", "Check every host before any is touched", "Roll out the clusters"):
        assert re.search(rf"PLAY \[{re.escape(play)}[^\n]*\n\s*skipping: no hosts matched", run.output), play
    assert "Read the host in one probe" not in run.output
    assert files_under(build / {"deploy_batch": "b", "deploy_demo": "demo", "deploy_empty": "e"}[key]) == []


def test_a_deploy_whose_registry_login_failed_reports_it_pulls_nothing_and_fails(runs):
    """The login failed the host (any_errors_fatal: the whole run) with no report; now it is kept as the
    host's pull result and the deploy is refused by the image pull, the password never shown."""
    run = runs[0]["deploy_login"]
    assert run.rc != 0, str(run)
    assert_no_traceback(run)
    assert LOGIN_PASSWORD not in run.output
    assert "TASK [pd.deploy.pd_image : Log the host's Docker engine in to the registry" in run.output, run.output[-4000:]
    lines = _report(run)
    assert lines[0].startswith("DEPLOY REFUSED BY THE IMAGE PULL: no container was touched"), run.output[-4000:]
    start = lines.index("Pulls that failed (fix the registry, the image reference or the credentials, then deploy again):")
    failed = lines[start + 1:start + 4]
    assert sorted(line.split(":", 1)[0].strip() for line in failed) == ["b-d0", "b-d1", "b-p0"], lines
    assert all(re.match(r"  b-\S+: the login to the registry 127\.0\.0\.1:5000 failed, nothing was pulled: \S", line)
               for line in failed), lines
    # no pull was tried after the failed login
    pull = run.output.split("TASK [pd.deploy.pd_image : Pull the images of this host's ranks", 1)[1].split("TASK [", 1)[0]
    assert "skipping: [b-p0]" in pull and "Error pulling" not in pull, pull
    stats = _stats(run)
    assert "outcome: refused by the image pull" in stats and "the login to the registry 127.0.0.1:5000 failed" in stats
    assert re.match(r"The deploy was refused by the image pull: the registry login or pulls failed on b-d0, b-d1, b-p0, "
                    r"listed in the report above", _closing_failure(run)), _closing_failure(run)
    assert "Take the deploy lock" not in run.output
