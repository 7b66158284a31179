"""report.summary after a deploy that stopped before its rollout, or left it out by --tags; and the
pd_report action that prints it as lines and keeps it in the run's custom stats (AWX artifacts)."""

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.pd.deploy.plugins.action import pd_report
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.report import refusal as refusals
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import order
from tests.unit.plugins.plugin_utils.plan.test_fleet import HOSTS, converged_probes, example_fleet

DOCKER = "a-p0: Docker engine not reachable at /var/run/docker.sock (connection refused) — start dockerd"


def _stopped_in_prechecks():
    """a-p0 failed its checks, b-d1 was unreachable, the others passed or were never judged."""
    probes = {h: {"containers": []} for h in HOSTS}
    probes["b-d1"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection refused"}
    verdicts = {"a-p0": {"failed": True, "msg": f"{DOCKER}\nWARNING a-p0: Docker keeps logs unrotated"},
                "a-d0": {"changed": False, "msg": "All assertions passed"}, "b-p0": {}}
    return {"probes": probes, "verdicts": verdicts}


def test_a_precheck_failure_reports_the_problems_and_no_container():
    plan = fleet.plan_fleet(example_fleet())
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, _stopped_in_prechecks())
    assert lines[0].startswith("DEPLOY REFUSED BY THE PRECHECKS: no container was touched")
    assert f"  {DOCKER}" in lines and "  a-p0: WARNING a-p0: Docker keeps logs unrotated" in lines
    assert "  b-d1: unreachable: Failed to connect to the host via ssh: Connection refused" in lines
    assert "Not judged (one host that fails or cannot be reached stops the prechecks of all): b-p0, b-d0" in lines
    assert lines[-2:] == ["cluster_a: not touched: the deploy stopped before its rollout",
                          "cluster_b: not touched: the deploy stopped before its rollout"]
    # what it printed before: every container on its port, as if it ran
    assert not any(" port " in line for line in lines)
    assert report.rollout_summary(plan, HOSTS, None, False, {}, {}, _stopped_in_prechecks()) == lines


def test_a_stop_before_the_prechecks_said_anything_says_so():
    plan = fleet.plan_fleet(example_fleet())
    lines = report.rollout_summary(plan, HOSTS, None, prechecks={"probes": {}, "verdicts": {}})
    assert lines[0].startswith("DEPLOY STOPPED before its rollout (see the failed task above)")
    assert not any(line.startswith(("Problems", "Hosts that", "Not judged")) for line in lines)


def test_a_render_is_still_a_list_of_containers():
    plan = fleet.plan_fleet(example_fleet())
    assert report.rollout_summary(plan, ["a-p0"])[0] == "cluster_a:"


def test_a_run_that_left_out_the_rollout_says_what_would_roll():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    probes["a-d0"]["containers"] = []
    targets = order.rollout_targets(plan, probes, HOSTS)
    lines = report.rollout_summary(plan, HOSTS, targets, rollout_skipped=True)
    assert lines[0] == "cluster_a: would be rolled out, not rolled: this run's --tags / --skip-tags leave out the rollout"
    assert "cluster_b: unchanged (every container runs its launch spec and answered its health URL)" in lines


def test_the_report_task_prints_lines_and_sets_global_stats():
    out = pd_report.report_result(["a", "b"], {"outcome": "ok"})
    assert out["msg"] == ["a", "b"] and not out["changed"]
    assert out["ansible_stats"] == {"data": {"pd_deploy_report": {"outcome": "ok", "lines": ["a", "b"]}},
                                    "per_host": False, "aggregate": False}
    assert pd_report.report_result("one\ntwo", stats_key="x")["ansible_stats"]["data"]["x"]["lines"] == ["one", "two"]


@pytest.mark.parametrize("args, says", [
    ({"lines": 3}, "lines: expected a list"), ({"lines": [], "data": [1]}, "data: expected a mapping"),
    ({"lines": [], "stats_key": "a b"}, "stats_key: 'a b' is not a variable name"),
])
def test_the_report_task_refuses_bad_arguments_by_name(args, says):
    with pytest.raises(AnsibleActionFail) as err:
        pd_report.report_result(**args)
    assert says in str(err.value)


def _judged(plan, problems=None, lost=None):
    """Every host judged (deploy-pd.yml's prechecks with pd_prechecks_report_failure): ``problems`` {host: msg}
    failed their check, ``lost`` {host: probe task result} could not be read (their check failed too)."""
    probes = {h: {"containers": [], "failed": False} for h in plan["hosts"]}
    verdicts = {h: {"failed": False, "msg": "All assertions passed"} for h in plan["hosts"]}
    for host, msg in (problems or {}).items():
        verdicts[host] = {"failed": True, "msg": msg}
    for host, probe in (lost or {}).items():
        probes[host] = probe
        verdicts[host] = {"failed": True, "msg": f"{host}: unreachable: {probe['msg']} — bring the host back"}
    return {"probes": probes, "verdicts": verdicts}


def test_a_precheck_refusal_names_its_hosts_and_nothing_else_refuses():
    plan = fleet.plan_fleet(example_fleet())
    assert refusals.refusal(plan, _judged(plan)) == {}
    assert refusals.refusal(plan, {"probes": {}, "verdicts": {}}) == {}   # --tags pull: no prechecks ran
    lost = {"b-d1": {"unreachable": True, "msg": "Connection refused"}}
    found = refusals.refusal(plan, _judged(plan, {"b-p0": f"b-p0: {DOCKER[6:]}"}, lost))
    assert found["stage"] == "prechecks" and found["hosts"] == ["b-p0", "b-d1"]
    assert found["message"].startswith("The deploy was refused by the prechecks: problems on b-p0, b-d1")
    assert "no container was touched" in found["message"]
    # a lost probe alone (its verdict missing: the prechecks stopped) refuses too
    assert refusals.refusal(plan, {"probes": lost, "verdicts": {}})["hosts"] == ["b-d1"]
    assert refusals.refusal(plan, _judged(plan, {"b-p0": "x"}, lost)) == found | {"message": found["message"]}


def test_every_host_judged_the_report_lists_problems_and_lost_hosts_and_no_container():
    plan = fleet.plan_fleet(example_fleet())
    lost = {"b-d1": {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection refused"}}
    prechecks = _judged(plan, {"a-p0": DOCKER}, lost)
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, prechecks)
    assert lines[0].startswith("DEPLOY REFUSED BY THE PRECHECKS: no container was touched")
    assert f"  {DOCKER}" in lines
    assert "  b-d1: unreachable: Failed to connect to the host via ssh: Connection refused" in lines
    assert not any(line.startswith("Not judged") for line in lines)
    assert not any(" port " in line for line in lines)


def test_the_verdicts_come_from_the_judged_probes_and_the_plays_problems():
    """deploy-pd.yml passes each host's pd_host_check result (its own ``problems``) and the decision's
    ``fleet_problems`` instead of verdicts: the same refusal and report as the verdicts they make."""
    plan = fleet.plan_fleet(example_fleet())
    lost = {"b-d1": {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection refused"}}
    probes = {h: {"containers": [], "problems": [], "docker_warnings": []} for h in plan["hosts"]}
    probes["a-p0"] = {"containers": [], "problems": [DOCKER], "docker_warnings": ["a-p0: Docker keeps logs unrotated"]}
    probes.update(lost)
    tags = "cluster_b: --tags engines would start engine ranks no proxy serves — run without --tags"
    derived = {"probes": probes, "fleet": {"a-p0": [tags]}}
    explicit = {"probes": probes, "verdicts": {
        h: {"failed": False, "msg": []} for h in plan["hosts"] if h not in ("a-p0", "b-d1")} | {
        "a-p0": {"failed": True, "msg": f"{DOCKER}\n{tags}\nWARNING a-p0: Docker keeps logs unrotated"}}}
    assert refusals.refusal(plan, derived) == refusals.refusal(plan, explicit)
    assert refusals.refusal(plan, derived)["hosts"] == ["a-p0", "b-d1"]
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, derived)
    assert lines == report.rollout_summary(plan, HOSTS, None, False, {}, {}, explicit)
    assert f"  {DOCKER}" in lines and f"  a-p0: {tags}" in lines
    assert "  a-p0: WARNING a-p0: Docker keeps logs unrotated" in lines
    assert not any(line.startswith("Not judged") for line in lines)
    # a probe that refused the role's variables is a problem listed with the others, not a host to bring back
    refused = dict(probes, **{"b-d1": {"failed": True, "msg": "Validation of arguments failed",
                                       "argument_errors": ["argument 'pd_prechecks_skip' is not a boolean"]}})
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, {"probes": refused, "fleet": {}})
    assert any(line.startswith("  b-d1: argument 'pd_prechecks_skip' is not a boolean — fix that variable")
               for line in lines)
    assert not any("could not be read" in line for line in lines)
    assert refusals.refusal(plan, {"probes": refused, "fleet": {}})["hosts"] == ["a-p0", "b-d1"]
    # no problem anywhere: nothing refused
    clean = {h: {"containers": [], "problems": [], "docker_warnings": []} for h in plan["hosts"]}
    assert refusals.refusal(plan, {"probes": clean, "fleet": {}}) == {}


def test_a_validate_refusal_reports_the_rules_broken_and_no_container():
    bad = example_fleet.__globals__["cluster_a"]()
    bad["decode"]["cpu_offload"] = "lots"   # not a size
    plan = fleet.plan_fleet(example_fleet(a=bad))
    assert not plan["ok"]
    errors = [v for v in plan["violations"] if v["level"] == "error"]
    found = refusals.refusal(plan, {"probes": {}, "verdicts": {}})
    assert found["stage"] == "validate" and found["hosts"] == []
    assert f"breaks {len(errors)} rule(s)" in found["message"] and "no host was contacted" in found["message"]
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, {"probes": {}, "verdicts": {}})
    assert lines[0] == (f"DEPLOY REFUSED BY VALIDATE: the inventory breaks {len(errors)} rule(s); no host was "
                        "contacted and nothing was touched")
    body = [line[2:] for line in lines if line.startswith("  ")]
    assert len(body) == len(errors) and all(v["field"] in line for v, line in zip(errors, body))
    assert lines[-2:] == ["cluster_a: not touched: the deploy was refused before any host was contacted",
                          "cluster_b: not touched: the deploy was refused before any host was contacted"]
    assert not any(" port " in line for line in lines)
    # a render-only deploy (no prechecks, no targets) of that plan is refused the same way, not listed
    assert report.rollout_summary(plan, HOSTS) == lines


@pytest.mark.parametrize("plan, prechecks", [("plan", {}), ({"clusters": {}, "hosts": {}}, {"probes": []})])
def test_refusal_names_the_filter_and_field_of_bad_input(plan, prechecks):
    with pytest.raises(Exception, match=r"^pd_deploy_refusal: (plan|prechecks): "):
        refusals.refusal(plan, prechecks)


PULL_ERROR = ("Error pulling image 127.0.0.1:5999/pd/vllm-ascend:v1 - HTTPConnectionPool(host='127.0.0.1', "
              "port=5999): Max retries exceeded (Connection refused)")


def _pulled(plan, failed=None, lost=None):
    """deploy-pd.yml's pull play with pd_image_report_failure: each host's pd_image_pull_result (a loop result);
    ``failed`` {host: [failed refs]} (the other refs pulled), ``lost`` {host: msg} could not be reached."""
    pulls = {}
    for host in plan["hosts"]:
        refs = sorted({spec["image"] for spec in plan["hosts"][host]["specs"]})
        bad = (failed or {}).get(host, [])
        results = [{"item": ref, "failed": True, "msg": PULL_ERROR} if ref in bad
                   else {"item": ref, "changed": True, "image": {"Id": "sha256:" + "1" * 64}} for ref in refs]
        pulls[host] = {"results": results, "changed": len(bad) < len(refs)}
        if bad:
            pulls[host] |= {"failed": True, "msg": "One or more items failed"}
    for host, msg in (lost or {}).items():
        pulls[host] = {"unreachable": True, "msg": msg}
    return pulls


def test_a_failed_pull_refuses_the_deploy_before_the_prechecks_problems():
    plan = fleet.plan_fleet(example_fleet())
    ref = plan["hosts"]["a-p0"]["specs"][0]["image"]
    pulls = _pulled(plan, {"a-p0": [ref]}, {"b-d1": "Failed to connect to the host via ssh: Connection refused"})
    # the prechecks ran after the pull (the pulled host lacks the image): the pull is named, the first stage
    found = refusals.refusal(plan, _judged(plan, {"a-p0": "a-p0: image missing"}) | {"pulls": pulls})
    assert found["stage"] == "pull" and found["outcome"] == "refused by the image pull"
    assert found["hosts"] == ["a-p0", "b-d1"]
    assert found["message"].startswith("The deploy was refused by the image pull: pulls failed on a-p0, b-d1")
    assert "no container was touched" in found["message"] and "docs/guide/pull.md" in found["message"]
    # every pull ended: nothing refuses; the prechecks' problems still do
    assert refusals.refusal(plan, _judged(plan) | {"pulls": _pulled(plan)}) == {}
    assert refusals.refusal(plan, _judged(plan, {"a-p0": "x"}) | {"pulls": _pulled(plan)})["stage"] == "prechecks"


def test_a_failed_pull_reports_each_failed_reference_and_no_container():
    plan = fleet.plan_fleet(example_fleet())
    ref = plan["hosts"]["a-p0"]["specs"][0]["image"]
    pulls = _pulled(plan, {"a-p0": [ref]}, {"b-d1": "Failed to connect to the host via ssh: Connection refused"})
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, _judged(plan) | {"pulls": pulls})
    assert lines[0].startswith("DEPLOY REFUSED BY THE IMAGE PULL: no container was touched")
    start = lines.index("Pulls that failed (fix the registry, the image reference or the credentials, then deploy again):")
    assert lines[start + 1:start + 3] == [f"  a-p0: {ref}: {PULL_ERROR}",
                                          "  b-d1: unreachable: Failed to connect to the host via ssh: Connection refused"]
    assert [line for line in lines if line.startswith("cluster_")] == [
        f"{name}: not touched: the deploy stopped before its rollout" for name in plan["clusters"]]
    assert not any(" port " in line for line in lines)   # no container listed


PING = ("a-p0: npu 0: cannot reach decode a-d0 npu 0 at 10.0.0.9 (100.00% packet loss) — KV transfer from this "
        "prefill NPU will stall")


def test_a_failed_npu_ping_refuses_the_deploy_and_names_its_problems():
    plan = fleet.plan_fleet(example_fleet())
    pings = {"a-p0": {"failed": True, "msg": PING, "evaluated_to": False}, "b-p0": {"changed": False, "msg": "ok"}}
    checks = _judged(plan) | {"pulls": _pulled(plan), "pings": pings}
    found = refusals.refusal(plan, checks)
    assert found["stage"] == "ping" and found["outcome"] == "refused by the NPU ping" and found["hosts"] == ["a-p0"]
    assert found["message"].startswith("The deploy was refused by the NPU ping: prefill NPUs on a-p0 cannot reach")
    assert "no container was touched" in found["message"]
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, checks)
    assert lines[0].startswith("DEPLOY REFUSED BY THE NPU PING: no container was touched")
    assert lines[1:3] == ["NPU ping problems (fix the NPU network between the paired NPUs, then deploy again):", f"  {PING}"]
    assert lines[3:] == [f"{name}: not touched: the deploy stopped before its rollout" for name in plan["clusters"]]
    # a ping that could not run (its line names no host: the host's is added)
    lost = {"a-p0": {"failed": True, "msg": "the NPU ping could not run: no answer"}}
    assert "  a-p0: the NPU ping could not run: no answer" in report.rollout_summary(
        plan, HOSTS, None, prechecks=_judged(plan) | {"pings": lost})
    # every ping answered: nothing refuses
    assert refusals.refusal(plan, _judged(plan) | {"pings": {"a-p0": {"failed": False}}}) == {}


@pytest.mark.parametrize("key", ["pulls", "pings"])
def test_refusal_refuses_a_stage_that_is_not_a_mapping(key):
    plan = fleet.plan_fleet(example_fleet())
    with pytest.raises(Exception, match=rf"^pd_deploy_refusal: prechecks: .*{key}"):
        refusals.refusal(plan, _judged(plan) | {key: []})


# ---- issue 23 item 6: validate's refusal of the run, and a failed registry login --------------------

@pytest.mark.parametrize("problem", [
    report.plan_problem(["/etc/pd/prod"], 5, False, True, "0"),
    report.plan_problem(["/x/inventories/local"], 5, True, True),
    report.plan_problem(["/tmp/empty"], 0),
])
def test_a_run_validate_refused_is_reported_with_its_text_and_no_container(problem):
    plan = fleet.plan_fleet(example_fleet())
    found = refusals.refusal(plan, {"probes": {}, "verdicts": {}}, problem)
    assert found == {"stage": "validate", "outcome": "refused by validate", "hosts": [],
                     "message": f"The deploy was refused by validate (no host was contacted): {problem}"}
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, {"probes": {}, "verdicts": {}}, False, problem)
    assert lines[:3] == ["DEPLOY REFUSED BY VALIDATE: no host was contacted and nothing was touched",
                         "Why (fix it, then deploy again):", f"  {problem}"]
    assert lines[3:] == [f"{name}: not touched: the deploy was refused before any host was contacted"
                         for name in plan["clusters"]]
    # render-only (no prechecks, no targets) the same
    assert report.rollout_summary(plan, HOSTS, problem=problem) == lines
    # under --limit cluster_a, the clusters of the run only
    limited = report.rollout_summary(plan, ["localhost", "a-p0", "a-d0"], problem=problem)
    assert limited == lines[:3] + ["cluster_a: not touched: the deploy was refused before any host was contacted"]


def test_the_runs_refusal_comes_before_the_plans_rules_and_nothing_else_refuses():
    bad = example_fleet.__globals__["cluster_a"]()
    bad["decode"]["cpu_offload"] = "lots"
    plan = fleet.plan_fleet(example_fleet(a=bad))
    problem = report.plan_problem(["/etc/pd/prod"], 5, False, True, "0")
    assert refusals.refusal(plan, {}, problem)["message"].endswith(problem)
    assert "DEPLOY REFUSED BY VALIDATE: no host was contacted" in report.rollout_summary(plan, HOSTS, problem=problem)[0]
    # no problem: the plan's rules, as before
    assert "breaks" in refusals.refusal(plan, {}, "")["message"]
    assert refusals.refusal(fleet.plan_fleet(example_fleet()), _judged(fleet.plan_fleet(example_fleet())), "") == {}
    with pytest.raises(Exception, match=r"^pd_deploy_refusal: problem: "):
        refusals.refusal(plan, {}, None)


LOGIN_ERROR = ("Logging into 127.0.0.1:5000 for user ci failed - 401 Client Error for "
               "http+docker://localhost/v1.47/auth: Unauthorized (\"login attempt to http://127.0.0.1:5000/v2/ failed "
               "with status: 401 Unauthorized\")")


def test_a_failed_registry_login_refuses_the_deploy_and_names_the_registry():
    """roles/pd_image with pd_image_report_failure: the failed login's result stands for the host's pull
    (pd_image_pull_result, ``login`` the registry); nothing was pulled after it."""
    plan = fleet.plan_fleet(example_fleet())
    pulls = _pulled(plan)
    pulls["b-p0"] = {"failed": True, "changed": False, "msg": LOGIN_ERROR, "login": "127.0.0.1:5000"}
    found = refusals.refusal(plan, _judged(plan) | {"pulls": pulls})
    assert found["stage"] == "pull" and found["hosts"] == ["b-p0"]
    assert found["message"].startswith("The deploy was refused by the image pull: the registry login or pulls failed "
                                       "on b-p0")
    lines = report.rollout_summary(plan, HOSTS, None, False, {}, {}, _judged(plan) | {"pulls": pulls})
    assert lines[0].startswith("DEPLOY REFUSED BY THE IMAGE PULL")
    start = lines.index("Pulls that failed (fix the registry, the image reference or the credentials, then deploy again):")
    assert lines[start + 1] == ("  b-p0: the login to the registry 127.0.0.1:5000 failed, nothing was pulled: "
                                + " ".join(LOGIN_ERROR.split()))
    # a host lost at its login reads as unreachable, not as a login refused
    lost = _pulled(plan) | {"b-d1": {"unreachable": True, "msg": "Failed to connect", "login": "127.0.0.1:5000"}}
    assert refusals.refusal(plan, _judged(plan) | {"pulls": lost})["message"].startswith(
        "The deploy was refused by the image pull: pulls failed on b-d1")
    assert "  b-d1: unreachable: Failed to connect" in report.rollout_summary(
        plan, HOSTS, None, False, {}, {}, _judged(plan) | {"pulls": lost})
    # a plain failed pull still reads as one
    assert "pulls failed on a-p0" in refusals.refusal(plan, _judged(plan) | {"pulls": _pulled(
        plan, {"a-p0": [plan["hosts"]["a-p0"]["specs"][0]["image"]]})})["message"]
