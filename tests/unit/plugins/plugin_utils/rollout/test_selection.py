"""rollout.selection: what --tags / --skip-tags run of a deploy, and the refusal of a half-deployed cluster."""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout.selection import tag_problems, tag_selection
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.unit.plugins.plugin_utils.plan.test_fleet import HOSTS, converged_probes, example_fleet, stale_proxy


@pytest.mark.parametrize("run, skip, on", [
    (["all"], [], {"prechecks", "pull", "engines", "proxy", "report"}),
    (["prechecks"], [], {"prechecks"}),
    (["pull"], [], {"pull"}),
    (["engines", "proxy"], [], {"engines", "proxy"}),
    (["all"], ["proxy"], {"prechecks", "pull", "engines", "report"}),
    (["all"], ["report", "pull"], {"prechecks", "engines", "proxy"}),
    ("engines,report", "", {"engines", "report"}),
    (["tagged"], [], {"prechecks", "pull", "engines", "proxy", "report"}),
    (["all"], ["all"], set()),
])
def test_selection_follows_ansible_tags(run, skip, on):
    got = tag_selection(run, skip)
    assert {t for t in ("prechecks", "pull", "engines", "proxy", "report") if got[t]} == on
    assert got["rollout"] == bool(on & {"engines", "proxy"})
    assert got["partial"] == (len(on & {"engines", "proxy"}) == 1)
    assert tag_selection(run, skip) == got  # no state kept between calls


def test_a_bad_tag_list_is_refused_by_field():
    with pytest.raises(PdError) as err:
        tag_selection([1, 2])
    assert err.value.field == "run_tags"


def _fresh_b_d1(plan):
    """cluster_b: b-d1's ranks absent (a scale-out or first deploy there), everything else converged."""
    probes = converged_probes(plan)
    probes["b-d1"]["containers"] = []
    return probes


def test_a_whole_selection_or_no_rollout_is_never_refused():
    plan = fleet.plan_fleet(example_fleet())
    probes = {h: {"containers": []} for h in HOSTS}
    for run, skip in ((["all"], []), (["prechecks"], []), (["engines", "proxy"], []), (["report"], []),
                      (["all"], ["engines", "proxy"])):
        assert tag_problems(plan, probes, HOSTS, run, skip) == []


def test_engines_without_the_proxy_are_refused_when_new_ranks_need_wiring():
    plan = fleet.plan_fleet(example_fleet())
    problems = tag_problems(plan, _fresh_b_d1(plan), HOSTS, ["all"], ["proxy"])
    assert len(problems) == 1 and problems[0].startswith("cluster_b: refused, nothing touched: this run leaves out the proxy")
    assert "new engine ranks on b-d1 the proxy would not serve: pd-cluster_b-decode0-dp2, pd-cluster_b-decode0-dp3" in problems[0]
    assert "run without --tags/--skip-tags" in problems[0]


def test_engines_without_the_proxy_pass_when_only_existing_ranks_change():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    probes["b-d1"]["containers"][0]["hash"] = "an-older-spec"
    assert tag_problems(plan, probes, HOSTS, ["engines"]) == []
    # the proxy side of that cluster is fine too, but the engines are not: refused the other way round
    problems = tag_problems(plan, probes, HOSTS, ["proxy"])
    assert len(problems) == 1 and "leaves out the engine ranks" in problems[0]
    assert f"b-d1 that do not run their launch spec: {probes['b-d1']['containers'][0]['name']}" in problems[0]


def test_a_changed_proxy_refuses_engines_alone_and_allows_the_proxy_alone():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    proxy = stale_proxy(plan, probes, "cluster_a")
    problems = tag_problems(plan, probes, HOSTS, ["engines"])
    assert problems == [problems[0]] and problems[0].startswith("cluster_a:")
    assert f"the proxy {proxy['name']} on {proxy['host']} does not run its launch spec" in problems[0]
    assert tag_problems(plan, probes, HOSTS, ["proxy"]) == []


def test_dropped_ranks_need_the_proxy():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    probes["b-d1"]["containers"].append({"name": "pd-cluster_b-decode1-dp0", "state": "running", "running": True,
                                         "hash": "x", "cluster": "cluster_b", "host": "b-d1"})
    problems = tag_problems(plan, probes, HOSTS, ["all"], ["proxy"])
    assert len(problems) == 1 and "dropped on b-d1" in problems[0] and "pd-cluster_b-decode1-dp0" in problems[0]


def test_probes_must_be_a_mapping():
    plan = fleet.plan_fleet(example_fleet())
    with pytest.raises(PdError):
        tag_problems(plan, None, HOSTS, ["engines"])
