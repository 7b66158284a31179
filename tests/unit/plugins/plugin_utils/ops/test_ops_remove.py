"""plugin_utils.ops.remove: what removing hosts takes, and the refusals made before anything is touched
(playbooks/remove_hosts.yml; issue 23 #7). Plans come from plan_fleet on fleets written here, so the
ranks, ports and addresses expected are the planner's own for these inputs."""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.filter.pd import FilterModule
from ansible_collections.pd.deploy.plugins.plugin_utils.ops import remove
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError


def _cluster(name, **roles):
    raw = {"name": name, "vllm_ascend_version": "main", "image": "quay.io/ascend/vllm-ascend:nightly-main",
           "model": {"path": "/data/models/DeepSeek-V4-Flash"},
           "prefill": {"offload_connector": "none"}, "decode": {"offload_connector": "none"}}
    for role, extra in roles.items():
        raw[role].update(extra)
    return raw


def _member(name, cluster, role, raw, address):
    return {"name": name, "groups": ["pd_clusters", cluster, role],
            "vars": {"pd_cluster": raw, "pd_host_address": address, "pd_host_ram": "1TiB", "pd_hccl_if": "enp189s0f0"}}


def _plan():
    """c: 2 prefill instances (p0, p1), 2 decode instances (d0, d1), one TP8 instance per host.
    s: 1 prefill instance (s-p0), 1 decode instance DP2 x TP8 spread over s-d0 and s-d1."""
    c = _cluster("c", prefill={"instances": 2, "dp": 1, "tp": 8}, decode={"instances": 2, "dp": 1, "tp": 8})
    s = _cluster("s", prefill={"dp": 1, "tp": 8}, decode={"dp": 2, "tp": 8})
    plan = fleet.plan_fleet({"hosts": [
        _member("p0", "c", "prefill", c, "10.0.0.1"), _member("p1", "c", "prefill", c, "10.0.0.2"),
        _member("d0", "c", "decode", c, "10.0.0.3"), _member("d1", "c", "decode", c, "10.0.0.4"),
        _member("s-p0", "s", "prefill", s, "10.0.1.1"),
        _member("s-d0", "s", "decode", s, "10.0.1.2"), _member("s-d1", "s", "decode", s, "10.0.1.3"),
    ], "limit": None})
    assert plan["ok"], plan["messages"]
    return plan


PLAN = _plan()


def _spec(host):
    (spec,) = PLAN["hosts"][host]["specs"]
    return spec


def _key(host):
    return f"{PLAN['hosts'][host]['address']}:{_spec(host)['ports']['http']}"


def test_removing_one_decode_host_drains_its_instance_and_keeps_the_others():
    got = remove.remove_hosts_plan(PLAN, "d1")
    assert got["problems"] == []
    (entry,) = got["clusters"]
    assert entry["cluster"] == "c"
    assert entry["removed"] == [{"role": "decode", "instance": _spec("d1")["instance"],
                                 "ranks": [{"name": _spec("d1")["name"], "host": "d1", "key": _key("d1")}]}]
    assert entry["want"] == {"prefill": [_key("p0"), _key("p1")], "decode": [_key("d0")]}
    assert entry["remaining"] == {"prefill": 2, "decode": 1}
    assert entry["proxy_host"] == PLAN["clusters"]["c"]["proxy"]["host"]
    assert entry["proxy_url"] == f"http://127.0.0.1:{PLAN['clusters']['c']['proxy']['ports']['http']}"
    assert got["containers"] == {"d1": [_spec("d1")["name"]]}
    # the proxy's restart file lists what stays, in the proxy's own format
    assert entry["backends_file"]["path"] == PLAN["clusters"]["c"]["proxy"]["backends_file"]["path"]
    assert f"--decoder-hosts {PLAN['hosts']['d0']['address']}\n" in entry["backends_file"]["content"]
    assert f"--decoder-ports {_spec('d0')['ports']['http']}\n" in entry["backends_file"]["content"]
    assert entry["lower"] == {"decode": [2, 1]}
    text = " ".join(got["lines"])
    assert "now delete d1 from the inventory" in text and "decode.instances: 2 -> 1" in text
    assert "renumbers" not in text  # decode instance 0 stays instance 0


def test_removing_the_first_instance_says_the_next_deploy_renumbers_the_rest():
    got = remove.remove_hosts_plan(PLAN, ["d0"])
    assert got["problems"] == []
    assert got["clusters"][0]["want"]["decode"] == [_key("d1")]
    assert "renumbers the remaining decode instance(s)" in " ".join(got["lines"])


def test_an_instance_spread_over_hosts_goes_whole_and_leaves_its_role_empty():
    # s's only decode instance has a rank on s-d0 and one on s-d1: removing s-d1 takes both
    got = remove.remove_hosts_plan(PLAN, "s-d1")
    (problem,) = got["problems"]
    assert problem.startswith("s: removing s-d1 would leave decode with no instance")
    assert "run on s-d0, s-d1" in problem
    assert "add a decode host, raise decode.instances and deploy before removing them" in problem
    # nothing to do when refused
    assert got["clusters"] == [] and got["containers"] == {} and got["lines"] == []


@pytest.mark.parametrize("hosts,role", [("d0,d1", "decode"), ("p1, d0 ,d1", "decode")])
def test_removing_every_host_of_a_role_is_refused(hosts, role):
    got = remove.remove_hosts_plan(PLAN, hosts)
    assert any(p.startswith(f"c: removing ") and f"leave {role} with no instance" in p for p in got["problems"])
    assert got["clusters"] == []


def test_removing_the_proxy_host_is_refused_with_the_fix():
    proxy = PLAN["clusters"]["c"]["proxy"]
    got = remove.remove_hosts_plan(PLAN, proxy["host"])
    (problem,) = got["problems"]
    assert problem == (f"c: {proxy['host']} runs the cluster's proxy {proxy['name']} (pd_cluster.proxy.host): set "
                       f"proxy.host to a host that stays and deploy, then remove {proxy['host']}")


def test_unknown_and_missing_hosts_are_named():
    got = remove.remove_hosts_plan(PLAN, "d1,nope")
    assert got["problems"] == [
        f"pd_remove_hosts: nope is not a host of any cluster of this inventory (cluster hosts: "
        f"{', '.join(sorted(PLAN['hosts']))}): check the name"]
    assert got["clusters"] == []
    for empty in ("", " , ", None, []):
        assert remove.remove_hosts_plan(PLAN, empty)["problems"] == [
            "pd_remove_hosts: no host given: name the hosts to remove, -e pd_remove_hosts=host1,host2"]


def test_hosts_of_two_clusters_are_planned_per_cluster():
    c = _cluster("c2", prefill={"instances": 2, "dp": 1, "tp": 8}, decode={"instances": 2, "dp": 1, "tp": 8})
    t = _cluster("t", prefill={"instances": 2, "dp": 1, "tp": 8}, decode={"dp": 1, "tp": 8})
    plan = fleet.plan_fleet({"hosts": [
        _member("p0", "c2", "prefill", c, "10.0.0.1"), _member("p1", "c2", "prefill", c, "10.0.0.2"),
        _member("d0", "c2", "decode", c, "10.0.0.3"), _member("d1", "c2", "decode", c, "10.0.0.4"),
        _member("t-p0", "t", "prefill", t, "10.0.2.1"), _member("t-p1", "t", "prefill", t, "10.0.2.2"),
        _member("t-d0", "t", "decode", t, "10.0.2.3"),
    ], "limit": None})
    assert plan["ok"], plan["messages"]
    got = remove.remove_hosts_plan(plan, "t-p1,d1")
    assert got["problems"] == []
    assert [e["cluster"] for e in got["clusters"]] == ["t", "c2"]
    assert set(got["containers"]) == {"t-p1", "d1"}


@pytest.mark.parametrize("bad", [{}, {"hosts": []}, None, "plan"])
def test_a_bad_plan_is_an_error_naming_the_fix(bad):
    with pytest.raises(PdError, match="pd_plan_fleet"):
        remove.remove_hosts_plan(bad, "d1")


@pytest.mark.parametrize("bad", [3, {"d1": True}, [1, "d1"]])
def test_bad_host_names_are_an_error(bad):
    with pytest.raises(PdError, match="pd_remove_hosts"):
        remove.remove_hosts_plan(PLAN, bad)


def test_pure_same_answer_twice_and_input_untouched():
    before = copy.deepcopy(PLAN)
    first = remove.remove_hosts_plan(PLAN, "d1")
    assert remove.remove_hosts_plan(PLAN, "d1") == first
    assert PLAN == before


def test_registered_as_a_filter():
    assert FilterModule().filters()["pd_remove_hosts_plan"] is remove.remove_hosts_plan
