"""plugin_utils.fleet.plan_fleet on plain fleet dicts (what validate.yml hands it from hostvars).

A fleet is {"hosts": [{name, groups, vars}], "limit": [...] | None}; each host's vars carry its
cluster's pd_cluster (from group_vars) and its own pd_* host variables.
"""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError


# ---- helpers ------------------------------------------------------------------------------------

def cluster_a():
    """The article's cluster (inventories/example/group_vars/cluster_a.yml, in short)."""
    return {
        "name": "cluster_a", "vllm_ascend_version": "main", "image": "quay.io/ascend/vllm-ascend:nightly-main",
        "model": {"path": "/data/models/DeepSeek-V4-Flash"},
        "prefill": {"offload_connector": "OffloadingConnector", "cpu_offload": "200GiB"},
        "decode": {"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                   "recompute_scheduler": True},
    }


def cluster_b():
    """DP4 x TP4 decode over two hosts, MooncakeHybridConnector, block 128."""
    return {
        "name": "cluster_b", "vllm_ascend_version": "0.25.1rc1", "image": "quay.io/ascend/vllm-ascend:v0.25.1rc1",
        "model": {"path": "/data/models/DeepSeek-V4-Flash"},
        "mooncake_connector": "MooncakeHybridConnector",
        "prefill": {"engine": {"block_size": 128, "prefix_cache_retention_interval": 16384}},
        "decode": {"dp": 4, "engine": {"block_size": 128}},
    }


def member(name, cluster, role, raw, address, **hv):
    groups = ["pd_clusters", cluster] + ([role] if isinstance(role, str) else list(role))
    return {"name": name, "groups": groups,
            "vars": dict({"pd_cluster": raw, "pd_host_address": address, "pd_host_ram": "1TiB",
                          "pd_hccl_if": "enp189s0f0"}, **hv)}


def example_fleet(a=None, b=None, limit=None):
    a = cluster_a() if a is None else a
    b = cluster_b() if b is None else b
    return {"hosts": [
        member("a-p0", "cluster_a", "prefill", a, "10.0.0.11"),
        member("a-d0", "cluster_a", "decode", a, "10.0.0.12"),
        member("b-p0", "cluster_b", "prefill", b, "10.0.1.11"),
        member("b-d0", "cluster_b", "decode", b, "10.0.1.12"),
        member("b-d1", "cluster_b", "decode", b, "10.0.1.13"),
    ], "limit": limit}


def errors(plan):
    return [v for v in plan["violations"] if v["level"] == "error"]


def find(plan, field, where=None, level="error"):
    return [v for v in plan["violations"]
            if v["field"] == field and v["level"] == level and (where is None or v["where"] == where)]


# ---- a good fleet -------------------------------------------------------------------------------

def test_good_fleet_is_ok_and_places_every_rank():
    plan = fleet.plan_fleet(example_fleet())
    assert errors(plan) == []
    assert plan["ok"] is True
    assert set(plan["hosts"]) == {"a-p0", "a-d0", "b-p0", "b-d0", "b-d1"}
    names = {h: sorted(s["name"] for s in rec["specs"]) for h, rec in plan["hosts"].items()}
    assert names["a-d0"] == ["pd-cluster_a-decode0-dp0", "pd-cluster_a-decode0-dp1"]
    assert names["b-d1"] == ["pd-cluster_b-decode0-dp2", "pd-cluster_b-decode0-dp3"]
    # the proxy lives on the first prefill host of each cluster
    assert plan["hosts"]["a-p0"]["proxy"]["name"] == "pd-cluster_a-proxy"
    assert plan["hosts"]["b-p0"]["proxy"]["name"] == "pd-cluster_b-proxy"
    assert plan["hosts"]["a-d0"]["proxy"] is None
    assert plan["clusters"]["cluster_b"]["hosts"] == ["b-p0", "b-d0", "b-d1"]
    assert len(plan["clusters"]["cluster_b"]["ranks"]) == 2 + 4
    assert plan["messages"] == [m for m in plan["messages"] if m.startswith("WARNING ")]


def test_warnings_alone_keep_the_fleet_ok():
    a = cluster_a()
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.9}   # benchmark ceiling: a warning
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert find(plan, "decode.engine.gpu_memory_utilization", level="warning")
    assert plan["ok"] is True


def test_fleet_not_ok_on_any_error():
    a = cluster_a()
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.96}
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert plan["ok"] is False
    assert any(m.startswith("ERROR cluster_a/decode: decode.engine.gpu_memory_utilization: ") for m in plan["messages"])


# ---- everything at once -------------------------------------------------------------------------

def test_all_violations_of_all_clusters_come_back_together():
    a = cluster_a()
    a["prefill"]["recompute_scheduler"] = True                     # rule error in cluster_a
    a["decode"]["engine"] = {"gpu_memory_utilization": 0.96}         # another rule error in cluster_a
    b = cluster_b()
    b["decode"]["engine"]["blok_size"] = 128                         # schema error in cluster_b
    f = example_fleet(a=a, b=b)
    f["hosts"].append(member("x-0", "cluster_a", ["prefill", "decode"], a, "10.0.0.99"))  # both role groups
    stray = member("y-0", "cluster_b", "decode", dict(cluster_b(), name="cluster_z"), "10.0.1.99")
    f["hosts"].append(stray)                                         # pd_cluster.name not its group
    plan = fleet.plan_fleet(f)
    assert plan["ok"] is False
    assert find(plan, "prefill.recompute_scheduler", "cluster_a/prefill")
    assert find(plan, "decode.engine.gpu_memory_utilization", "cluster_a/decode")
    assert find(plan, "decode.engine.blok_size", "cluster_b")
    assert find(plan, "groups", "x-0")
    assert find(plan, "pd_cluster.name", "y-0")
    assert len(plan["messages"]) == len(plan["violations"])


def test_a_broken_cluster_renders_nothing_while_the_other_still_plans():
    a = cluster_a()
    a["decode"]["engine"] = {"blok_size": 32}
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert plan["hosts"]["a-d0"]["specs"] == [] and plan["hosts"]["a-p0"]["proxy"] is None
    assert len(plan["hosts"]["b-d0"]["specs"]) == 2


# ---- schema errors ------------------------------------------------------------------------------

def test_typo_key_is_reported_with_its_full_dotted_path():
    a = cluster_a()
    a["prefill"]["engine"] = {"blok_size": 32}
    plan = fleet.plan_fleet(example_fleet(a=a))
    found = find(plan, "prefill.engine.blok_size", "cluster_a")
    assert len(found) == 1
    assert "blok_size" in found[0]["message"]
    assert "remove or rename the key" in found[0]["fix"]
    assert "ERROR cluster_a: prefill.engine.blok_size: " in "\n".join(plan["messages"])


def test_two_typos_in_one_mapping_are_two_violations():
    a = cluster_a()
    a["proxy"] = {"prot": 8000, "hots": "a-p0"}
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert find(plan, "proxy.prot", "cluster_a") and find(plan, "proxy.hots", "cluster_a")


def test_wrong_types_and_values_name_their_field():
    a = cluster_a()
    a["decode"]["dp"] = "2"
    a["prefill"]["engine"] = {"block_size": 48}
    a["mooncake_connector"] = "Mooncake"
    plan = fleet.plan_fleet(example_fleet(a=a))
    for field in ("decode.dp", "prefill.engine.block_size", "mooncake_connector"):
        found = find(plan, field, "cluster_a")
        assert found, field
        assert "plugins/plugin_utils/schemas/cluster.schema.json" in found[0]["fix"]


def test_missing_required_key_is_reported():
    a = cluster_a()
    del a["image"]
    plan = fleet.plan_fleet(example_fleet(a=a))
    assert any(v["field"] == "image" and "missing" in v["message"] and v["where"] == "cluster_a"
               for v in errors(plan))


def test_bad_host_variable_names_the_host_and_the_variable():
    f = example_fleet()
    f["hosts"][1]["vars"]["pd_npus"] = 6
    plan = fleet.plan_fleet(f)
    found = find(plan, "pd_npus", "a-d0")
    assert found and "6" in found[0]["message"]


# ---- group membership ---------------------------------------------------------------------------

def test_host_in_neither_role_group():
    f = example_fleet()
    f["hosts"][4]["groups"] = ["pd_clusters", "cluster_b"]
    plan = fleet.plan_fleet(f)
    found = find(plan, "groups", "b-d1")
    assert len(found) == 1 and "neither" in found[0]["message"]
    assert "exactly one of the groups 'prefill' and 'decode'" in found[0]["fix"]
    # b-d1's NPUs are missing from cluster_b's decode: DP4 x TP4 no longer fits
    assert find(plan, "decode.instances", "cluster_b/decode")


def test_host_in_both_role_groups():
    f = example_fleet()
    f["hosts"][0]["groups"].append("decode")
    plan = fleet.plan_fleet(f)
    found = find(plan, "groups", "a-p0")
    assert len(found) == 1 and "prefill and decode" in found[0]["message"]


def test_cluster_name_must_be_a_group_of_the_host():
    b = dict(cluster_b(), name="cluster_c")
    plan = fleet.plan_fleet(example_fleet(b=b))
    found = find(plan, "pd_cluster.name")
    # one group_vars value read by three hosts: one violation naming them (issue 21: not once per host)
    assert [v["where"] for v in found] == ["b-p0, b-d0, b-d1"]
    assert "'cluster_c'" in found[0]["message"]
    assert "group name" in found[0]["fix"]


def test_host_without_pd_cluster():
    f = example_fleet()
    del f["hosts"][0]["vars"]["pd_cluster"]
    plan = fleet.plan_fleet(f)
    assert find(plan, "pd_cluster", "a-p0")


def test_empty_fleet_is_an_error():
    plan = fleet.plan_fleet({"hosts": [], "limit": None})
    assert plan["ok"] is False
    assert find(plan, "pd_clusters", "inventory")


# ---- ports across clusters ----------------------------------------------------------------------

def shared_address_fleet(b_prefill, hccl_if_base_port=60032):
    """cluster_a and a second cluster whose prefill host shares a-p0's address (one 16-NPU machine:
    cluster_c's prefill takes NPUs 8-15).

    cluster_c's HCCL window starts after cluster_a's 60000..60031 unless a test says otherwise.
    """
    a = cluster_a()
    c = {"name": "cluster_c", "vllm_ascend_version": "0.25.1", "image": "img:1",
         "model": {"path": "/data/models/DeepSeek-V4-Flash"}, "proxy": {"port": 9000},
         "prefill": b_prefill, "decode": {}, "hccl_if_base_port": hccl_if_base_port}
    return {"hosts": [
        member("a-p0", "cluster_a", "prefill", a, "10.0.0.11"),
        member("a-d0", "cluster_a", "decode", a, "10.0.0.12"),
        member("c-p0", "cluster_c", "prefill", c, "10.0.0.11", pd_npu_first=8),
        member("c-d0", "cluster_c", "decode", c, "10.0.0.13"),
    ], "limit": None}


def collisions(plan):
    return find(plan, "ports")


def test_http_port_collision_across_two_clusters_on_one_address():
    plan = fleet.plan_fleet(shared_address_fleet({"dp_rpc_port": 14000, "kv_port": 31000}))
    found = collisions(plan)
    # both prefill ranks of cluster_c reuse cluster_a's 8100 and 8101 on 10.0.0.11
    assert len(found) == 2
    text = "\n".join(v["message"] for v in found)
    assert "pd-cluster_c-prefill0-dp0 and pd-cluster_a-prefill0-dp0 (cluster cluster_a) both use port(s) 8100 " in text
    assert "pd-cluster_c-prefill0-dp1 and pd-cluster_a-prefill0-dp1 (cluster cluster_a) both use port(s) 8101 " in text
    assert all("10.0.0.11" in v["message"] and v["where"] == "cluster_c@c-p0" for v in found)
    assert all("port_base" in v["fix"] for v in found)
    assert plan["ok"] is False


def test_dp_rpc_port_collision_across_clusters():
    plan = fleet.plan_fleet(shared_address_fleet({"port_base": 8500, "kv_port": 31000}))
    found = collisions(plan)
    assert len(found) == 1
    assert "pd-cluster_c-prefill0-dp0" in found[0]["message"] and "13389" in found[0]["message"]


def test_kv_port_range_collision_across_clusters():
    plan = fleet.plan_fleet(shared_address_fleet({"port_base": 8500, "dp_rpc_port": 14000}))
    found = collisions(plan)
    assert found and all("30000" in v["message"] for v in found)
    assert plan["ok"] is False


def test_distinct_ports_on_a_shared_address_are_fine():
    plan = fleet.plan_fleet(shared_address_fleet({"port_base": 8500, "dp_rpc_port": 14000, "kv_port": 31000}))
    assert collisions(plan) == []
    assert plan["ok"] is True, plan["messages"]


def test_hccl_windows_of_two_clusters_on_one_address_collide():
    # both clusters' prefill instances on 10.0.0.11 with HCCL's default 60000..60031
    plan = fleet.plan_fleet(shared_address_fleet({"port_base": 8500, "dp_rpc_port": 14000, "kv_port": 31000},
                                                 hccl_if_base_port=60000))
    found = find(plan, "hccl_if_base_port")
    assert len(found) == 1, plan["messages"]
    assert found[0]["where"] == "cluster_c/prefill/instance 0@c-p0"
    assert "60000..60031" in found[0]["message"] and "cluster cluster_a" in found[0]["message"]
    assert "set hccl_if_base_port to 60032" in found[0]["fix"]
    assert plan["ok"] is False


def test_rendered_port_in_another_clusters_mooncake_window():
    # cluster_c's HTTP port 20100 falls in the transport window of NPUs 0..3 (rank 0 of either
    # cluster): 20000 + 0 x 100 .. 20000 + 4 x 100 = 20000..20400 on 10.0.0.11
    plan = fleet.plan_fleet(shared_address_fleet({"port_base": 20100, "dp_rpc_port": 14000, "kv_port": 31000}))
    found = find(plan, "prefill.port_base")
    assert any("port(s) 20100 " in v["message"] and "20000..20400" in v["message"] for v in found), \
        plan["messages"]
    assert all(v["where"].startswith("cluster_c/prefill") for v in found)
    assert plan["ok"] is False


def test_same_ports_on_different_addresses_are_fine():
    # cluster_a and cluster_b use the same default ports on their own hosts
    plan = fleet.plan_fleet(example_fleet())
    assert collisions(plan) == []


def test_collision_inside_one_cluster_is_reported_once():
    raw = {"name": "local", "vllm_ascend_version": "0.25.1", "image": "img:1", "model": {"path": "/m"},
           "decode": {"port_base": 8100}}
    f = {"hosts": [member("l-p0", "local", "prefill", raw, "127.0.0.1"),
                   member("l-d0", "local", "decode", raw, "127.0.0.1")], "limit": None}
    plan = fleet.plan_fleet(f)
    for port in (8100, 8101):
        assert len([m for m in plan["messages"] if f"port {port} " in m]) == 1, plan["messages"]
    assert plan["ok"] is False


# ---- rollout batches ----------------------------------------------------------------------------

def test_batches_are_consecutive_hosts_of_one_cluster():
    plan = fleet.plan_fleet(example_fleet())
    assert plan["batches"] == [2, 3]


@pytest.mark.parametrize("limit, batches", [
    (["b-p0", "b-d0", "b-d1"], [3]),
    (["a-p0", "a-d0"], [2]),
    (["a-p0", "b-p0"], [1, 1]),
    (["a-d0", "b-d1", "b-d0"], [1, 2]),
])
def test_batches_follow_the_limit(limit, batches):
    plan = fleet.plan_fleet(example_fleet(limit=limit))
    assert plan["batches"] == batches


def test_plan_does_not_modify_the_fleet():
    f = example_fleet()
    before = copy.deepcopy(f)
    fleet.plan_fleet(f)
    assert f == before


# ---- rollout targets: which clusters a deploy rolls ---------------------------------------------

HOSTS = ["a-p0", "a-d0", "b-p0", "b-d0", "b-d1"]


def converged_probes(plan, hosts=HOSTS):
    """pd_host_probe results of a fleet where every container runs its launch spec."""
    out = {}
    for host in hosts:
        entry = plan["hosts"][host]
        specs = entry["specs"] + ([entry["proxy"]] if entry["proxy"] else [])
        out[host] = {"containers": [{"name": s["name"], "state": "running", "running": True,
                                     "hash": s["labels"]["pd.spec-hash"]} for s in specs]}
    return out


def stale_proxy(plan, probes, cluster):
    """Make the cluster's proxy run an older spec in ``probes``; returns the plan's proxy entry."""
    proxy = plan["clusters"][cluster]["proxy"]
    for c in probes[proxy["host"]]["containers"]:
        if c["name"] == proxy["name"]:
            c["hash"] = "old"
    return proxy


def test_a_converged_fleet_rolls_nothing():
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, converged_probes(plan), HOSTS)
    assert targets == {"hosts": [], "batches": [1], "changed": [], "unchanged": ["cluster_a", "cluster_b"],
                       "pending": {}, "reasons": {}, "removed": {}, "images": {h: {} for h in HOSTS},
                       "moved": [], "warnings": []}


def test_a_fresh_fleet_rolls_every_cluster_in_play_order():
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, {h: {"containers": []} for h in HOSTS}, HOSTS)
    assert targets["hosts"] == HOSTS and targets["batches"] == [2, 3]
    assert targets["changed"] == ["cluster_a", "cluster_b"] and targets["unchanged"] == []
    assert targets["pending"]["b-d1"] == ["pd-cluster_b-decode0-dp2", "pd-cluster_b-decode0-dp3"]


@pytest.mark.parametrize("container_change", [
    {"hash": "an-older-spec"},                   # the spec changed
    {"running": False, "state": "exited"},       # same spec, stopped
    None,                                        # removed
])
def test_one_container_not_running_its_spec_rolls_its_whole_cluster_only(container_change):
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    rank = probes["b-d1"]["containers"][1]
    if container_change is None:
        probes["b-d1"]["containers"].remove(rank)
    else:
        rank.update(container_change)
    targets = order.rollout_targets(plan, probes, HOSTS)
    # every host of cluster_b goes through the rollout (D before P before proxy), cluster_a is left alone
    assert targets["hosts"] == ["b-p0", "b-d0", "b-d1"] and targets["batches"] == [3]
    assert targets["changed"] == ["cluster_b"] and targets["unchanged"] == ["cluster_a"]
    assert targets["pending"] == {"b-d1": [rank["name"]]}


def test_a_changed_proxy_rolls_its_cluster():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    stale_proxy(plan, probes, "cluster_a")
    targets = order.rollout_targets(plan, probes, HOSTS)
    assert targets["changed"] == ["cluster_a"] and targets["hosts"] == ["a-p0", "a-d0"]


def test_targets_follow_the_play_hosts():
    plan = fleet.plan_fleet(example_fleet(limit=["b-p0", "b-d0", "b-d1"]))
    play = ["b-p0", "b-d0", "b-d1"]
    targets = order.rollout_targets(plan, {h: {"containers": []} for h in play}, play)
    assert targets["hosts"] == play and targets["changed"] == ["cluster_b"] and targets["unchanged"] == []


def test_a_host_without_probe_is_refused():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    del probes["a-d0"]
    with pytest.raises(PdError) as err:
        order.rollout_targets(plan, probes, HOSTS)
    assert err.value.field == "probes.a-d0" and "pd_prechecks" in err.value.fix
    with pytest.raises(PdError):
        order.rollout_targets(plan, None, HOSTS)


def test_rollout_summary_says_which_clusters_were_rolled_and_which_left_alone():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    probes["a-d0"]["containers"] = []
    targets = order.rollout_targets(plan, probes, HOSTS)
    lines = report.rollout_summary(plan, HOSTS, targets)
    assert lines[0] == "cluster_a: rolled out"
    assert report.rollout_summary(plan, HOSTS, targets, True)[0] == \
        "cluster_a: would be rolled out (--check: nothing was changed)"
    # the containers that were started or recreated are marked, the others are not
    assert "  pd-cluster_a-decode0-dp0 on a-d0 port 8200: started: it did not exist" in lines
    assert "  pd-cluster_a-prefill0-dp0 on a-p0 port 8100" in lines
    assert "cluster_b: unchanged (every container runs its launch spec and answered its health URL)" in lines
    # without targets (render-only) the clusters are just listed; hosts outside the play are left out
    assert report.rollout_summary(plan, ["a-p0"])[0] == "cluster_a:"
    assert not any(line.startswith("cluster_b") for line in report.rollout_summary(plan, ["a-p0"]))


# ---- capacity of A2 and A3 hosts (issue 10 finding 5) -------------------------------------------

GIB = 1024 ** 3


def test_a3_hosts_of_16_npus_plan_and_estimate_per_host_of_16():
    """Atlas 800T A3: 16 NPUs of 64 GB (vllm-ascend DeepSeek-V4-Flash tutorial: 128GB x 8 cards of two
    dies). P and D of DP4 x TP4 fill one host each; experts spread over EP16 = 16 per NPU."""
    raw = cluster_a()
    raw["image"] = "quay.io/ascend/vllm-ascend:nightly-main-a3"   # A3 hosts run the -a3 image
    raw["prefill"].update(dp=4, tp=4, kv_port=40000)
    raw["decode"].update(dp=4, tp=4, kv_port=40100)
    a3 = {"pd_npus": 16, "pd_npu_chip": "Ascend910", "pd_hbm_per_npu": "64GiB"}
    plan = fleet.plan_fleet({"hosts": [member("p0", "cluster_a", "prefill", raw, "10.0.0.1", **a3),
                                       member("d0", "cluster_a", "decode", raw, "10.0.0.2", **a3)],
                             "limit": None})
    assert errors(plan) == [], plan["messages"]
    cap = plan["clusters"]["cluster_a"]["capacity"]
    for role in ("prefill", "decode"):
        entry = cap[role]
        assert entry["expert_parallel_size"] == 16
        assert entry["kv_budget_per_host_bytes"] == entry["kv_budget_per_npu_bytes"] * 16
        assert entry["kv_budget_per_instance_bytes"] == entry["kv_budget_per_npu_bytes"] * 16
        assert entry["kv_budget_per_dp_group_bytes"] == entry["kv_budget_per_npu_bytes"] * 4
    assert plan["hosts"]["p0"]["npu_chip"] == "Ascend910" and plan["hosts"]["p0"]["npus"] == 16
    assert len(plan["hosts"]["p0"]["specs"]) == 4


def test_an_instance_spanning_two_hosts_counts_each_hosts_share():
    """cluster_b's decode DP4 x TP4 over two 8-NPU hosts: per host = 8 NPUs, per instance = 16."""
    plan = fleet.plan_fleet(example_fleet())
    d = plan["clusters"]["cluster_b"]["capacity"]["decode"]
    assert d["kv_budget_by_host_bytes"] == {"b-d0": d["kv_budget_per_npu_bytes"] * 8,
                                           "b-d1": d["kv_budget_per_npu_bytes"] * 8}
    assert d["kv_budget_per_instance_bytes"] == d["kv_budget_per_npu_bytes"] * 16


def test_weights_that_do_not_fit_a_910b4_fail_the_plan():
    hosts = example_fleet()["hosts"][:2]
    for host in hosts:
        host["vars"].update(pd_hbm_per_npu="32GiB", pd_npu_chip="910B4")
    plan = fleet.plan_fleet({"hosts": hosts, "limit": None})
    found = [v for v in errors(plan) if v["field"] == "model.quantization"]
    assert [v["where"] for v in found] == ["cluster_a/prefill@a-p0", "cluster_a/decode@a-d0"]
    assert plan["ok"] is False


@pytest.mark.parametrize("sources, slug", [
    (["/etc/pd/prod"], "prod"),
    (["/etc/pd/prod/"], "prod"),
    (["/etc/pd/prod/hosts.yml"], "prod"),
    (["/srv/inventories/example/hosts.yaml"], "example"),
    (["/srv/inv/staging.yml"], "staging"),
    (["/srv/inv/INVENTORY.ini"], "inv"),
    (["a-p0,a-d0,"], "adhoc"),
    (["/srv/my fleet:1"], "my_fleet_1"),
    (["/a/east", "/b/west/hosts.yml"], "east+west"),
    ("/a/east", "east"),
    ([], "default"),
    (["/srv/.."], "inventory"),
    (["/srv/collection"], "collection-inventory"),
])
def test_inventory_slug_names_one_safe_directory_per_inventory(sources, slug):
    from ansible_collections.pd.deploy.plugins.plugin_utils.report.summary import inventory_slug
    assert inventory_slug(sources) == slug


@pytest.mark.parametrize("change, reason", [
    ({"hash": "an-older-spec"}, "recreated: its launch spec changed"),
    ({"running": False, "state": "exited"}, "restarted: it was not running (same launch spec)"),
    (None, "started: it did not exist"),
    ("kept", "an interrupted replacement, finished"),
    ("kept-exited", "an interrupted replacement, started afresh"),
    # the container role removes and restarts this one (replacement_plan: interrupted), not "recreated"
    ("kept-changed-exited", "an interrupted replacement, started afresh"),
])
def test_the_summary_says_why_each_container_was_started(change, reason):
    # a plain restart of an unchanged spec is not called a changed launch spec
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    rank = probes["b-d1"]["containers"][1]
    if change is None:
        probes["b-d1"]["containers"].remove(rank)
    elif isinstance(change, str):
        probes["b-d1"]["containers"].append(dict(rank, name=rank["name"] + "-previous", hash="old", running=False))
        if change.endswith("exited"):
            rank.update(running=False, state="exited")
        if change == "kept-changed-exited":
            rank.update(hash="another")
    else:
        rank.update(change)
    targets = order.rollout_targets(plan, probes, HOSTS)
    assert targets["reasons"] == {"b-d1": {rank["name"]: reason}}
    port = next(s for s in plan["hosts"]["b-d1"]["specs"] if s["name"] == rank["name"])["ports"]["http"]
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes={h: {"done": True} for h in targets["hosts"]})
    assert f"  {rank['name']} on b-d1 port {port}: {reason}" in lines
    others = [line for line in lines if line.startswith("  ") and rank["name"] + " " not in line]
    assert others and not any(":" in line.split(" port ")[1] for line in others)


def _failed_rollout(plan, probes_before):
    """A rollout of both clusters that stopped on b-d1: cluster_a ended, cluster_b's batch was rescued."""
    targets = order.rollout_targets(plan, probes_before, HOSTS)
    outcomes = {"a-p0": {"done": True}, "a-d0": {"done": True},
                "b-p0": {"done": False, "task": "Roll", "msg": "b-d1: 1 container(s) never answered\nmore"},
                "b-d0": {"done": False, "task": "Roll", "msg": ""}}
    return targets, outcomes


def test_the_report_after_a_failure_tells_each_containers_spec_leftovers_and_lost_hosts():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    fresh = {h: {"containers": []} for h in HOSTS}
    targets, outcomes = _failed_rollout(plan, fresh)
    assert report.failed_hosts(targets, outcomes) == ["b-p0", "b-d0", "b-d1"]
    after = converged_probes(plan)
    specs = {s["name"]: s for s in plan["hosts"]["b-d0"]["specs"]}
    old, new = list(specs)[:2]
    after["b-d0"]["containers"] = [
        {"name": old, "state": "running", "running": True, "hash": "the-old-spec"},
        {"name": new, "state": "restarting", "running": False, "hash": specs[new]["labels"]["pd.spec-hash"]},
        {"name": new + "-previous", "state": "exited", "running": False, "hash": "the-old-spec"},
    ]
    after["b-d1"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh"}
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes,
                                   probes={h: after[h] for h in targets["hosts"]})
    text = "\n".join(lines)
    assert lines[0] == 'DEPLOY FAILED on b-p0 at task "Roll": b-d1: 1 container(s) never answered'
    assert "cluster_a: rolled out before the failure" in lines
    assert any(line.startswith("cluster_b: FAILED during its rollout (3 of 7 containers") for line in lines)
    port = {n: s["ports"]["http"] for n, s in specs.items()}
    assert f"  {old} on b-d0 port {port[old]}: OLD launch spec, running" in lines
    assert f"  {new} on b-d0 port {port[new]}: current launch spec, NOT running (restarting)" in lines
    assert any(line.startswith(f"  leftover {new}-previous on b-d0, stopped") for line in lines)
    assert "unknown (its host could not be read)" in text
    assert lines[-1].startswith("Host b-d1 could not be read (unreachable: Failed to connect")
    assert "prefill0-dp0 on b-p0 port" in text and "cluster_a" in text


def test_a_cluster_the_failed_deploy_never_reached_says_so():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, {h: {"containers": []} for h in HOSTS}, HOSTS)
    outcomes = {"a-p0": {"done": False, "task": "Take the deploy lock", "msg": "held by another run"}}
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes,
                                   probes={h: {"containers": []} for h in targets["hosts"]})
    assert lines[0].startswith('DEPLOY FAILED on a-p0 at task "Take the deploy lock"')
    assert "cluster_a: FAILED during its rollout (0 of 5 containers run their current launch spec)" in lines
    assert any(line.startswith("cluster_b: not rolled out: the deploy stopped before this cluster") for line in lines)
    assert sum("MISSING (no container)" in line for line in lines) == 12


def test_a_deploy_refused_by_another_runs_lock_reports_only_not_touched_held_by():
    """Issue 20: the refused cluster was reported "FAILED during its rollout" with the other run's
    leftover -previous, and the closing message asked to fix the cause."""
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, {h: {"containers": []} for h in HOSTS}, HOSTS)
    held = "sre@ctl-other, ansible-playbook pid 4242, started 2026-12-01T10:02:00Z"
    refused = {"done": False, "task": "Take the deploy lock of each cluster of this batch",
               "msg": "cluster cluster_b: its deploy lock ... held by another run", "locked": {"cluster_b": held}}
    # cluster_a's batch ended; cluster_b's batch stopped at its lock (every host of the batch records it)
    outcomes = {"a-p0": {"done": True}, "a-d0": {"done": True}, "b-p0": refused,
                "b-d0": dict(refused, task="", msg=""), "b-d1": dict(refused, task="", msg="")}
    # what runs on cluster_b is the other run's work: a replacement half done
    after = converged_probes(plan)
    name = plan["hosts"]["b-d0"]["specs"][0]["name"]
    after["b-d0"]["containers"].append({"name": name + "-previous", "state": "exited", "running": False, "hash": "x"})
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes, probes=after)
    assert lines[0].startswith("DEPLOY REFUSED: the deploy lock of cluster_b is held by another run")
    assert f"cluster_b: not touched, held by {held} (its deploy lock, see the message above)" in lines
    assert not any("FAILED" in line or "leftover" in line or "cluster_b-" in line for line in lines), lines
    assert "cluster_a: rolled out before the failure" in lines
    message = report.failure_message(targets, outcomes)
    assert "held by another run" in message and "not touched" in message and "Fix the cause" not in message
    # a batch of two clusters stopped at one's lock: the other one was not touched either
    both = {h: dict(refused, locked={"cluster_a": held}) for h in HOSTS}
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=both, probes=after)
    assert "cluster_b: not touched: the deploy stopped at the deploy lock of cluster_a, held by another run, " \
           "before this cluster changed" in lines
    # a lock refused in a later batch, after a failure elsewhere, is not the whole story: the usual message
    mixed = dict(outcomes, **{"a-p0": {"done": False, "task": "Roll", "msg": "boom"}})
    assert report.failure_message(targets, mixed).startswith("The rollout stopped on a-p0")


def test_after_a_failure_a_cluster_left_alone_is_reported_from_its_hosts_read_again():
    """Issue 20: after a daemon restart the untouched cluster was reported "unchanged (every container
    answered its health URL)" from the prechecks' reading while all its containers were stopped."""
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    before = converged_probes(plan)
    before["b-d0"]["containers"] = []  # only cluster_b changes; cluster_a is left alone
    targets = order.rollout_targets(plan, before, HOSTS)
    assert targets["changed"] == ["cluster_b"]
    outcomes = {"b-p0": {"done": False, "task": "Roll", "msg": "Docker did not answer"}, "b-d0": {}, "b-d1": {}}
    after = converged_probes(plan)
    for c in after["a-d0"]["containers"]:
        c.update(running=False, state="exited")  # the daemon restart stopped them
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes, probes=after)
    assert not any("answered its health URL" in line for line in lines), lines
    head = next(line for line in lines if line.startswith("cluster_a"))
    assert head.startswith("cluster_a: not rolled out (no change to roll); read again after the failure, ")
    stopped = [line for line in lines if line.endswith("current launch spec, NOT running (exited)")]
    assert stopped and all(" on a-d0 port " in line for line in stopped)
    # not read again (its host did not answer): not claimed either
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes,
                                   probes=dict(after, **{"a-d0": {"unreachable": True, "msg": "gone"}}))
    assert any(line.endswith("unknown (its host could not be read)") and " a-d0 " in line for line in lines)
    # read again and fine: says so
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes, probes=converged_probes(plan))
    assert "cluster_a: unchanged (no change to roll; read again after the failure: every container runs its " \
           "launch spec)" in lines


def test_a_successful_or_dry_run_reads_nothing_again():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, {h: {"containers": []} for h in HOSTS}, HOSTS)
    done = {h: {"done": True} for h in HOSTS}
    assert report.failed_hosts(targets, done) == []
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=done, probes={"a-p0": {"unreachable": True}})
    assert lines[0] == "cluster_a: rolled out" and not any("could not be read" in line for line in lines)
    assert report.rollout_summary(plan, HOSTS, targets, True, outcomes={})[0].startswith("cluster_a: would be")



# ---- know what runs: image IDs in the report, a moved tag warns (issue 19 item 4) --------------------

OLD_ID, NEW_ID = "sha256:" + "0a" * 32, "sha256:" + "1b" * 32
NIGHTLY = "quay.io/ascend/vllm-ascend:nightly-main"


def _on_images(probes, running, now):
    """The probes with every container running ``running`` and every image reference naming ``now``."""
    for probe in probes.values():
        for c in probe["containers"]:
            c["image_id"] = running
        probe["image_refs"] = {NIGHTLY: {"id": now, "repo_digests": []},
                               "quay.io/ascend/vllm-ascend:v0.25.1rc1": {"id": running, "repo_digests": []}}
    return probes


def test_a_moved_tag_rolls_nothing_and_warns_once_per_cluster():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    targets = order.rollout_targets(plan, _on_images(converged_probes(plan), OLD_ID, NEW_ID), HOSTS)
    # cluster_a runs nightly-main, which moved; cluster_b runs v0.25.1rc1, which did not
    assert targets["hosts"] == [] and targets["changed"] == [] and targets["pending"] == {}
    a_names = sorted(s["name"] for h in ("a-p0", "a-d0") for s in plan["hosts"][h]["specs"]) + \
        ["pd-cluster_a-proxy"]
    assert sorted(m["name"] for m in targets["moved"]) == a_names
    assert {m["cluster"] for m in targets["moved"]} == {"cluster_a"}
    (warning,) = targets["warnings"]
    assert warning.startswith("WARNING cluster_a: pd-cluster_a-") and f"its tag {NIGHTLY} now names image 1b1b1b1b1b1b" in warning
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes={})
    assert lines[-1] == warning
    assert "  pd-cluster_a-decode0-dp0 on a-d0 port 8200 (image 0a0a0a0a0a0a; its tag now names 1b1b1b1b1b1b: " \
           "see the WARNING below)" in lines
    b_line = next(line for line in lines if line.startswith("  pd-cluster_b-decode0-dp0 "))
    assert b_line.endswith(" (image 0a0a0a0a0a0a)")


def test_the_report_shows_the_image_a_started_container_is_started_from():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    probes = _on_images(converged_probes(plan), OLD_ID, NEW_ID)
    probes["a-d0"]["containers"] = []
    targets = order.rollout_targets(plan, probes, HOSTS)
    # started now: the image the tag names; still running: the one it runs (and its tag moved)
    assert targets["images"]["a-d0"]["pd-cluster_a-decode0-dp0"] == NEW_ID
    assert targets["images"]["a-p0"]["pd-cluster_a-prefill0-dp0"] == OLD_ID
    # only what keeps running is a move: a-p0's ranks and proxy, not a-d0's ranks started afresh
    assert {m["host"] for m in targets["moved"]} == {"a-p0"} and "pd-cluster_a-proxy" in [m["name"] for m in targets["moved"]]
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes={h: {"done": True} for h in targets["hosts"]})
    assert "  pd-cluster_a-decode0-dp0 on a-d0 port 8200: started: it did not exist (image 1b1b1b1b1b1b)" in lines


def test_the_report_after_a_failure_shows_the_image_each_container_runs_as_read_again():
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    plan = fleet.plan_fleet(example_fleet())
    targets, outcomes = _failed_rollout(plan, {h: {"containers": []} for h in HOSTS})
    after = _on_images(converged_probes(plan), OLD_ID, NEW_ID)
    lines = report.rollout_summary(plan, HOSTS, targets, outcomes=outcomes, probes={h: after[h] for h in targets["hosts"]})
    assert "  pd-cluster_b-decode0-dp0 on b-d0 port 8200: current launch spec, running, image 0a0a0a0a0a0a" in lines

def _waves(plan, probes, cluster="cluster_b", role="decode"):
    return order.rollout_waves(plan, cluster, role, probes)


def test_each_instance_is_listed_with_the_keys_its_proxy_uses():
    plan = fleet.plan_fleet(example_fleet())
    summary = plan["clusters"]["cluster_b"]
    proxy = summary["proxy"]["command"]
    hosts = proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")]
    ports = proxy[proxy.index("--decoder-ports") + 1:proxy.index("--max-retries")]
    keys = [r["key"] for inst in summary["instances"]["decode"] for r in inst["ranks"]]
    assert keys == [f"{h}:{p}" for h, p in zip(hosts, ports)]
    assert [r["name"] for inst in summary["instances"]["decode"] for r in inst["ranks"]] == \
        [s["name"] for h in summary["hosts"] for s in plan["hosts"][h]["specs"] if s["role"] == "decode"]


def test_a_single_instance_is_not_drained_and_nothing_to_do_is_no_wave():
    plan = fleet.plan_fleet(example_fleet())
    probes = converged_probes(plan)
    assert _waves(plan, probes) == []
    # cluster_b has one decode instance: nothing else would serve while it is drained, so no drain
    rank = probes["b-d1"]["containers"][0]
    rank["hash"] = "older"
    proxy = plan["clusters"]["cluster_b"]["proxy"]
    assert _waves(plan, probes) == [{"label": "decode ranks started together", "role": "decode",
                                     "names": [rank["name"]], "drain": [],
                                     "proxy_host": "b-p0", "proxy_url": "http://127.0.0.1:8000", "timeout_s": 60,
                                     "proxy_name": proxy["name"], "serving_file": proxy["serving_file"], "join": {}}]
    assert proxy["serving_file"].endswith(f"/{proxy['name']}.serving.json")


def test_several_serving_instances_roll_one_at_a_time_after_the_new_ones():
    b = cluster_b()
    b["decode"] = {"instances": 2, "dp": 2, "engine": {"block_size": 128}}
    plan = fleet.plan_fleet(example_fleet(b=b))
    assert errors(plan) == []
    insts = plan["clusters"]["cluster_b"]["instances"]["decode"]
    assert [len(i["ranks"]) for i in insts] == [2, 2]
    probes = converged_probes(plan)
    for host in ("b-d0", "b-d1"):
        for c in probes[host]["containers"]:
            c["hash"] = "older"
    waves = _waves(plan, probes)
    assert [w["label"] for w in waves] == ["decode instance 0", "decode instance 1"]
    assert [w["names"] for w in waves] == [[r["name"] for r in i["ranks"]] for i in insts]
    assert [w["drain"] for w in waves] == [[r["key"] for r in i["ranks"]] for i in insts]
    # an instance whose ranks do not run (new, or all stopped) starts first, without drain
    first = insts[0]["ranks"]
    for host in ("b-d0", "b-d1"):
        probes[host]["containers"] = [c for c in probes[host]["containers"]
                                      if c["name"] not in {r["name"] for r in first}]
    waves = _waves(plan, probes)
    assert [(w["label"], w["drain"]) for w in waves] == [
        ("decode ranks started together", []), ("decode instance 1", [r["key"] for r in insts[1]["ranks"]])]
    # issue 20 item 4: before the drain wave takes instance 1 out, the proxy must serve every instance of
    # the plan, the one the first wave started included (a scale-out never leaves decode without one)
    backends = plan["clusters"]["cluster_b"]["proxy"]["backends"]
    assert [w["join"] for w in waves] == [{}, backends]
    assert set(backends["decode"]) == {r["key"] for i in insts for r in i["ranks"]}
    # the proxy not running: nothing to drain from, one wave
    proxy = plan["clusters"]["cluster_b"]["proxy"]["name"]
    for c in probes["b-p0"]["containers"]:
        if c["name"] == proxy:
            c["running"] = False
    assert [w["drain"] for w in _waves(plan, probes)] == [[]]
    for c in probes["b-p0"]["containers"]:
        c["running"] = True
    # drain_timeout_s 0 turns the drain off: everything starts together
    plan["clusters"]["cluster_b"]["drain_timeout_s"] = 0
    assert [w["drain"] for w in _waves(plan, probes)] == [[]]


def test_a_first_deploy_starts_prefill_and_decode_in_one_wave():
    # no order between P and D (docs/design.md, "Rollout waves"): every engine rank of the cluster in
    # one wave, without drain; the old rollout ran a decode pass, then a prefill pass
    plan = fleet.plan_fleet(example_fleet())
    probes = {h: {"containers": []} for h in HOSTS}
    waves = _waves(plan, probes, role="all")
    names = [s["name"] for h in ("b-p0", "b-d0", "b-d1") for s in plan["hosts"][h]["specs"]]
    assert [(w["label"], w["role"], w["drain"]) for w in waves] == [
        ("decode and prefill ranks started together", "decode+prefill", [])]
    assert sorted(waves[0]["names"]) == sorted(names)
    assert {s["role"] for h in ("b-p0", "b-d0", "b-d1") for s in plan["hosts"][h]["specs"]} == {"prefill", "decode"}


def _cluster_b_ranks_older(plan):
    """Probes of a converged fleet where every rank of cluster b (not its proxy) runs an older spec."""
    probes = converged_probes(plan)
    for host in ("b-p0", "b-d0", "b-d1"):
        for c in probes[host]["containers"]:
            if c["name"] != plan["clusters"]["cluster_b"]["proxy"]["name"]:
                c["hash"] = "older"
    return probes


def test_a_change_of_every_instance_drains_what_it_can_first_and_replaces_single_instances_last():
    # two decode instances serving behind the running proxy, one prefill instance: each decode instance
    # is drained and replaced on its own, with its role for the proxy's /instances calls; the prefill
    # rank (nothing else serves its role: no drain) is replaced after them, so that a failed decode wave
    # leaves it serving
    b = cluster_b()
    b["decode"] = {"instances": 2, "dp": 2, "engine": {"block_size": 128}}
    plan = fleet.plan_fleet(example_fleet(b=b))
    probes = _cluster_b_ranks_older(plan)
    waves = _waves(plan, probes, role="all")
    prefill = [s["name"] for s in plan["hosts"]["b-p0"]["specs"] if s["role"] == "prefill"]
    assert [(w["label"], w["role"], bool(w["drain"])) for w in waves] == [
        ("decode instance 0", "decode", True), ("decode instance 1", "decode", True),
        ("prefill ranks replaced without drain (no other instance serves their role)", "prefill", False)]
    assert waves[-1]["names"] == prefill
    # one role at a time still works (and keeps its waves)
    assert [w["label"] for w in _waves(plan, probes, role="decode")] == ["decode instance 0", "decode instance 1"]


def test_an_upgrade_of_one_instance_per_role_replaces_prefill_and_decode_in_one_wave():
    # the version row / image case: every rank serving, one instance per role, nothing to drain:
    # prefill and decode are replaced together (one engine load, not two)
    plan = fleet.plan_fleet(example_fleet())
    probes = _cluster_b_ranks_older(plan)
    waves = _waves(plan, probes, role="all")
    names = [s["name"] for h in ("b-p0", "b-d0", "b-d1") for s in plan["hosts"][h]["specs"]]
    assert [(w["label"], w["role"], w["drain"]) for w in waves] == [
        ("decode and prefill ranks started together", "decode+prefill", [])]
    assert sorted(waves[0]["names"]) == sorted(names)


@pytest.mark.parametrize("value, clusters, want", [
    (None, 4, 1), ("", 4, 1), (2, 4, 2), ("2", 4, 2), (" 3 ", 4, 3), (9, 4, 9),
    ("25%", 4, 1), ("50%", 4, 2), ("100%", 4, 4), ("10%", 4, 1), ("60%", 5, 3), ("1%", 0, 1),
])
def test_the_cluster_batch_is_a_count_or_a_share_of_the_clusters(value, clusters, want):
    assert order.cluster_batch_size(value, clusters) == want


@pytest.mark.parametrize("value", [0, "0", -1, "-1", "0%", "101%", "150%", "abc", "2.5", 2.5, True, "25 %", "%", [2]])
def test_a_bad_cluster_batch_is_refused_with_the_fix(value):
    with pytest.raises(PdError) as err:
        order.cluster_batch_size(value, 4)
    text = str(err.value)
    assert "pd_cluster_batch" in text and repr(value) in text and "-e pd_cluster_batch=N" in text


def test_the_playbook_check_gets_the_refusal_as_a_message():
    assert order.cluster_batch_problem("25%") == "" and order.cluster_batch_problem(2) == ""
    assert order.cluster_batch_problem("two").startswith("deploy-pd.yml: pd_cluster_batch: 'two' is neither")
    assert "pd_parallel_clusters=true" in order.cluster_batch_problem("2", True)


def test_a_cluster_batch_with_parallel_clusters_is_refused_and_parallel_alone_is_every_cluster():
    assert order.cluster_batch_size(None, 3, parallel=True) == 3
    with pytest.raises(PdError) as err:
        order.cluster_batch_size("2", 3, parallel=True)
    assert "pd_parallel_clusters=true" in str(err.value) and "pd_cluster_batch=100%" in str(err.value)


def test_cluster_batches_group_whole_clusters_in_play_order():
    sizes = (("a", 2), ("b", 3), ("c", 1), ("d", 2), ("e", 1))
    hosts = {f"{c}-{i}": {"cluster": c} for c, n in sizes for i in range(n)}
    play = list(hosts)
    assert order.rollout_batches(play, hosts) == [2, 3, 1, 2, 1]
    assert order.rollout_batches(play, hosts, 2) == [5, 3, 1]
    assert order.rollout_batches(play, hosts, 3) == [6, 3]
    assert order.rollout_batches(play, hosts, 9) == [9]
    plan = fleet.plan_fleet(example_fleet())
    fresh = {h: {"containers": []} for h in HOSTS}
    assert order.rollout_targets(plan, fresh, HOSTS, "2")["batches"] == [5]
    assert order.rollout_targets(plan, fresh, HOSTS, "50%")["batches"] == [2, 3]
    assert order.rollout_targets(plan, fresh, HOSTS, None, True)["batches"] == [5]
    # a bad value is refused even when nothing is to roll
    with pytest.raises(PdError):
        order.rollout_targets(plan, converged_probes(plan), HOSTS, "0")


# ---- elastic P/D: the proxy is re-wired, not recreated ----------------------------------------

def test_the_proxy_hash_leaves_its_backends_out_so_scaling_does_not_recreate_it():
    b = cluster_b()
    small = fleet.plan_fleet(example_fleet(b=dict(b, decode={"instances": 1, "dp": 2, "engine": {"block_size": 128}})))
    large = fleet.plan_fleet(example_fleet(b=dict(b, decode={"instances": 2, "dp": 2, "engine": {"block_size": 128}})))
    p_small, p_large = (p["clusters"]["cluster_b"]["proxy"] for p in (small, large))
    assert p_small["command"] != p_large["command"]  # a re-created proxy starts with every instance
    assert p_small["labels"]["pd.spec-hash"] == p_large["labels"]["pd.spec-hash"]
    assert len(p_large["backends"]["decode"]) == 4 and len(p_small["backends"]["decode"]) == 2
    # anything else of the proxy still changes its hash
    moved = fleet.plan_fleet(example_fleet(b=dict(b, proxy={"port": 8001})))
    assert moved["clusters"]["cluster_b"]["proxy"]["labels"]["pd.spec-hash"] != \
        fleet.plan_fleet(example_fleet())["clusters"]["cluster_b"]["proxy"]["labels"]["pd.spec-hash"]


def _scaled(instances):
    b = cluster_b()
    b["decode"] = {"instances": instances, "dp": 2, "engine": {"block_size": 128}}
    return fleet.plan_fleet(example_fleet(b=b))


def test_scaling_out_starts_only_the_new_ranks_and_rewires_the_proxy():
    before, after = _scaled(1), _scaled(2)
    probes = converged_probes(before)
    proxy = before["clusters"]["cluster_b"]["proxy"]
    probes["b-p0"]["wiring"] = {proxy["name"]: proxy["backends"]}
    targets = order.rollout_targets(after, probes, HOSTS)
    new = [r["name"] for r in after["clusters"]["cluster_b"]["instances"]["decode"][1]["ranks"]]
    assert targets["changed"] == ["cluster_b"]
    assert sorted(n for names in targets["pending"].values() for n in names) == sorted(new)
    assert targets["removed"] == {}
    waves = order.rollout_waves(after, "cluster_b", "decode", probes)
    assert waves == [dict(waves[0], names=new, drain=[])]  # only the new ranks, no drain


def test_scaling_in_removes_the_dropped_ranks_and_rewires_the_proxy():
    before, after = _scaled(2), _scaled(1)
    probes = converged_probes(before)
    for host in probes:
        for c in probes[host]["containers"]:
            c.update(cluster=before["hosts"][host]["cluster"], host=host)
    proxy = before["clusters"]["cluster_b"]["proxy"]
    probes["b-p0"]["wiring"] = {proxy["name"]: proxy["backends"]}
    targets = order.rollout_targets(after, probes, HOSTS)
    dropped = [r for r in before["clusters"]["cluster_b"]["instances"]["decode"][1]["ranks"]]
    assert targets["changed"] == ["cluster_b"] and targets["pending"] == {}
    assert sorted(n for names in targets["removed"].values() for n in names) == sorted(r["name"] for r in dropped)
    assert "cluster_a" in targets["unchanged"]
    from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
    lines = report.rollout_summary(after, HOSTS, targets, outcomes={h: {"done": True} for h in targets["hosts"]})
    assert any(line.startswith(f"  removed {dropped[0]['name']} on ") for line in lines)
    assert any(line.endswith("re-wired live: its instances were added or removed") for line in lines)


def test_a_proxy_wired_as_planned_or_unreadable_is_no_change():
    plan = _scaled(1)
    probes = converged_probes(plan)
    proxy = plan["clusters"]["cluster_b"]["proxy"]
    for wiring in (proxy["backends"], {"error": "ConnectionRefusedError"}, None):
        probes["b-p0"]["wiring"] = {proxy["name"]: wiring} if wiring is not None else {}
        assert order.rollout_targets(plan, probes, HOSTS)["changed"] == []
    # listed in another order: still the same instances
    probes["b-p0"]["wiring"] = {proxy["name"]: {r: list(reversed(k)) for r, k in proxy["backends"].items()}}
    assert order.rollout_targets(plan, probes, HOSTS)["changed"] == []


def test_only_this_hosts_dropped_ranks_are_orphans_not_kept_previous_or_baseline_containers():
    from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers
    plan = _scaled(1)
    entry = plan["hosts"]["b-d0"]
    rank = entry["specs"][0]["name"]
    mine = {"cluster": "cluster_b", "host": "b-d0"}
    found = [dict(mine, name=rank), dict(mine, name=rank + "-previous"),
             dict(mine, name=rank + "-baseline", baseline=True),
             dict(mine, name="pd-cluster_b-decode7-dp0"),
             {"name": "pd-cluster_b-decode8-dp0", "cluster": "cluster_b", "host": "b-d1"},  # another host's
             {"name": "pd-cluster_b-decode9-dp0", "cluster": "cluster_b"},  # no pd.host: an older pd-deploy's
             {"name": "pd-cluster_a-decode0-dp0", "cluster": "cluster_a", "host": "b-d0"}]
    assert containers.orphans(entry, found, "b-d0") == ["pd-cluster_b-decode7-dp0"]


def test_a_docker_daemon_that_lists_other_hosts_containers_finds_no_orphans():
    # Molecule's simulated hosts share one Docker daemon: each probe lists every host's containers
    plan = _scaled(2)
    probes = converged_probes(plan)
    every = [dict(c, cluster=plan["hosts"][h]["cluster"], host=h) for h in probes for c in probes[h]["containers"]]
    shared = {h: {"containers": every} for h in probes}
    targets = order.rollout_targets(plan, shared, HOSTS)
    assert targets["changed"] == [] and targets["removed"] == {}
