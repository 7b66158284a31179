"""issue 12 "fail closed": classes of broken inventories the validator used to let through.

Each case is a copy of the example fleet (tests/unit/plugins/plugin_utils/plan/test_fleet.py helpers) with one realistic mistake;
the plan must be refused with a violation naming where, the field and a fix, and never raise.
"""

import copy

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from test_fleet import cluster_a, example_fleet, member

GIB = 1024 ** 3


def plan_of(f):
    return fleet.plan_fleet(f)


def errors(plan, field=None):
    return [v for v in plan["violations"] if v["level"] == "error" and (field is None or v["field"] == field)]


def host_vars(f, name):
    return next(h for h in f["hosts"] if h["name"] == name)["vars"]


def with_cluster_a(change):
    a = cluster_a()
    change(a)
    return example_fleet(a=a)


# ---- required host facts have no silent default ---------------------------------------------------

@pytest.mark.parametrize("drop, field", [
    ("pd_hccl_if", "pd_hccl_if"),            # was rendered as eth0
    ("pd_host_ram", "pd_host_ram"),          # was assumed 1 TiB
    ("pd_host_address", "pd_host_address"),  # HCCL_IF_IP was the inventory name
])
def test_a_missing_required_host_fact_is_an_error_naming_host_and_field(drop, field):
    f = example_fleet()
    del host_vars(f, "a-d0")[drop]
    plan = plan_of(f)
    found = errors(plan, field)
    assert plan["ok"] is False and found, plan["messages"]
    assert found[0]["where"] == "a-d0" and field in found[0]["fix"]


def test_an_address_that_is_not_an_ip_is_refused():
    f = example_fleet()
    hv = host_vars(f, "a-d0")
    del hv["pd_host_address"]
    hv["ansible_host"] = "gpu-node-7.example"
    found = errors(plan_of(f), "ansible_host")
    assert found and "not an IP address" in found[0]["message"] and "pd_host_address" in found[0]["fix"]


def test_an_ipv6_address_is_a_warning_that_the_proxy_cannot_add_or_remove_it_live():
    # issue 20: upstream's /instances/add|remove split each instance at ":" (parse_server_addresses)
    f = example_fleet()
    host_vars(f, "a-d0")["pd_host_address"] = "fd00::12"
    found = [v for v in plan_of(f)["violations"] if v["where"] == "a-d0" and v["field"] == "pd_host_address"]
    assert [v["level"] for v in found] == ["warning"], found
    assert "IPv6" in found[0]["message"] and "cannot add or remove it while it runs" in found[0]["message"]
    assert "IPv4" in found[0]["fix"]
    assert not [v for v in plan_of(example_fleet())["violations"] if "IPv6" in v["message"]]


# ---- unknown pd_* keys ------------------------------------------------------------------------------

def test_a_mistyped_host_key_is_refused_by_name_with_a_suggestion():
    f = example_fleet()
    f["hosts"][1]["keys"] = ["pd_cluster", "pd_host_address", "pd_hostram"]
    found = errors(plan_of(f), "pd_hostram")
    assert found and found[0]["where"] == "a-d0"
    assert "pd_host_ram" in found[0]["fix"]


def test_role_defaults_and_documented_switches_are_known():
    from ansible_collections.pd.deploy.plugins.plugin_utils.validate import inventory

    known = inventory.known_variables()
    # a role default, a documented playbook switch, a host fact, the cluster dict
    for name in ("pd_container_pull", "pd_render_only", "pd_parallel_clusters", "pd_prechecks_skip",
                 "pd_stop_confirm", "pd_hccl_if", "pd_cluster", "pd_docker_socket"):
        assert name in known, name
    assert "pd_hostram" not in known and "pd_render_onyl" not in known


# ---- idle hosts, clusters named like parent groups, one machine listed twice ---------------------------

def test_an_idle_host_is_an_error_unless_the_inventory_opts_in():
    f = example_fleet()
    a = host_vars(f, "a-d0")["pd_cluster"]
    f["hosts"].insert(2, member("a-d1", "cluster_a", "decode", a, "10.0.0.13"))
    found = errors(plan_of(f), "hosts")
    assert found and "a-d1" in found[0]["where"] and "pd_allow_idle_hosts" in found[0]["fix"]
    f["hosts"][2]["vars"]["pd_allow_idle_hosts"] = True
    assert errors(plan_of(f), "hosts") == []


@pytest.mark.parametrize("name", ["decode", "prefill", "pd_clusters", "all"])
def test_a_cluster_named_like_a_parent_group_is_refused(name):
    f = example_fleet()
    for h in f["hosts"][2:]:
        h["vars"]["pd_cluster"] = dict(h["vars"]["pd_cluster"], name=name)
        h["groups"].append(name)
    found = errors(plan_of(f), "pd_cluster.name")
    assert found and "parent group" in found[0]["message"]


def test_two_hosts_at_one_address_sharing_npus_are_refused():
    f = example_fleet()
    host_vars(f, "b-d1")["pd_host_address"] = "10.0.1.12"   # b-d0's address: the same machine twice
    found = errors(plan_of(f), "pd_npu_first")
    assert found and "b-d0" in found[0]["message"] and "b-d1" in found[0]["message"]
    # a 16-NPU machine split between the two entries is fine
    host_vars(f, "b-d1")["pd_npu_first"] = 8
    assert errors(plan_of(f), "pd_npu_first") == []


def test_roles_sharing_a_machine_may_not_pin_more_than_its_ram():
    f = example_fleet()
    # a-d0 on a-p0's machine, NPUs 8-15: each role pins 200GiB, reserve 128GiB: 528GiB > 512GiB
    for name in ("a-p0", "a-d0"):
        host_vars(f, name)["pd_host_ram"] = "512GiB"
    host_vars(f, "a-d0").update(pd_host_address="10.0.0.11", pd_npu_first=8)
    found = errors(plan_of(f), "pd_host_ram")
    assert found and "one machine" in found[0]["message"] and "512GiB" in found[0]["message"]


# ---- extra_args / env may not override what the renderer owns --------------------------------------

@pytest.mark.parametrize("extra, key", [
    (["--port", "9000"], "decode.port_base"),
    (["--kv-transfer-config", "{}"], "decode.offload_connector"),
    (["-tp", "8"], "decode.tp"),
    (["--max_model_len=4096"], "decode.engine.max_model_len"),
    (["--no-enable-prefix-caching"], "decode.engine.enable_prefix_caching"),
])
def test_extra_args_repeating_a_rendered_flag_are_refused_with_the_key_to_use(extra, key):
    plan = plan_of(with_cluster_a(lambda a: a["decode"].setdefault("engine", {}).update(extra_args=extra)))
    found = errors(plan, "decode.engine.extra_args")
    assert found and key in found[0]["fix"], plan["messages"]


def test_extra_args_with_new_flags_pass():
    plan = plan_of(with_cluster_a(lambda a: a["decode"].setdefault("engine", {}).update(
        extra_args=["--seed", "7", "--max-logprobs", "5"])))
    assert errors(plan, "decode.engine.extra_args") == []


@pytest.mark.parametrize("name, key", [
    ("ASCEND_RT_VISIBLE_DEVICES", "pd_npu_first"),
    ("HCCL_IF_IP", "pd_host_address"),
    ("HCCL_SOCKET_IFNAME", "pd_hccl_if"),
])
def test_env_overriding_a_rendered_variable_is_refused(name, key):
    plan = plan_of(with_cluster_a(lambda a: a["prefill"].update(env={name: "x"})))
    found = errors(plan, f"prefill.env.{name}")
    assert found and key in found[0]["fix"]


def test_env_may_tune_the_common_defaults():
    plan = plan_of(with_cluster_a(lambda a: a["prefill"].update(env={"HCCL_BUFFSIZE": "2048"})))
    assert plan["ok"], plan["messages"]


# ---- strings that reach Docker ---------------------------------------------------------------------

@pytest.mark.parametrize("change, field", [
    (lambda a: a.update(image="quay.io/ascend/vllm ascend:v0.25.1"), "image"),
    (lambda a: a["model"].update(path="/data/models/v4:flash"), "model.path"),
    (lambda a: a["decode"].update(env={"BAD-NAME": "1"}), "decode.env"),
    (lambda a: a["decode"].update(env={"1ST": "1"}), "decode.env"),
])
def test_strings_docker_would_misread_are_refused(change, field):
    found = errors(plan_of(with_cluster_a(change)), field)
    assert found, field


def test_a_relative_ascend_root_is_refused():
    f = example_fleet()
    host_vars(f, "a-p0")["pd_ascend_root"] = "var/lib/ascend"
    found = errors(plan_of(f), "pd_ascend_root")
    assert found and "relative" in found[0]["message"]


def test_decode_batched_tokens_below_max_num_seqs_is_refused():
    # vLLM SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs, else it refuses to start
    plan = plan_of(with_cluster_a(lambda a: a["decode"].update(engine={"max_num_batched_tokens": 32})))
    found = errors(plan, "decode.engine.max_num_batched_tokens")
    assert found and "48" in found[0]["message"]


# ---- one size grammar and schema messages that say what is wrong -------------------------------------

@pytest.mark.parametrize("value", ["200GB", "200G", "200gb", "200g"])
def test_decimal_looking_offload_sizes_are_refused_as_ambiguous(value):
    plan = plan_of(with_cluster_a(lambda a: a["decode"].update(cpu_offload=value)))
    found = errors(plan, "decode.cpu_offload")
    assert found and "ambiguous" in found[0]["message"] and "GiB" in found[0]["fix"], plan["messages"]


@pytest.mark.parametrize("value", ["200gib", "200 GiB", "200 gib", 200 * GIB])
def test_binary_sizes_in_any_case_are_accepted(value):
    plan = plan_of(with_cluster_a(lambda a: a["decode"].update(cpu_offload=value)))
    assert plan["ok"], plan["messages"]


def test_a_negative_size_says_negative():
    plan = plan_of(with_cluster_a(lambda a: a["decode"].update(cpu_offload=-5)))
    found = errors(plan, "decode.cpu_offload")
    assert found and "negative" in found[0]["message"]
    assert "any of the given schemas" not in " ".join(plan["messages"])


def test_missing_keys_are_each_named():
    a = cluster_a()
    del a["model"], a["vllm_ascend_version"]
    plan = plan_of(example_fleet(a=a))
    assert {"model", "vllm_ascend_version"} <= {v["field"] for v in errors(plan)}


# ---- internal errors become violations -------------------------------------------------------------

def test_zero_hbm_is_a_violation_naming_the_host():
    f = example_fleet()
    host_vars(f, "a-d0")["pd_hbm_per_npu"] = 0
    plan = plan_of(f)
    assert plan["ok"] is False
    found = errors(plan, "pd_hbm_per_npu")
    assert found and found[0]["where"].endswith("a-d0"), plan["messages"]


def test_nan_utilization_is_a_violation_naming_the_field():
    plan = plan_of(with_cluster_a(lambda a: a["decode"].update(engine={"gpu_memory_utilization": float("nan")})))
    found = errors(plan, "decode.engine.gpu_memory_utilization")
    assert found and "finite" in found[0]["message"]


def test_no_cluster_at_all_is_an_error():
    plan = plan_of({"hosts": [], "limit": None})
    assert plan["ok"] is False and "holds no cluster" in plan["messages"][0]


def test_plan_never_raises_for_odd_values():
    for value in (None, [], "x", {"a": 1}, -1, 1.5):
        f = copy.deepcopy(example_fleet())
        host_vars(f, "a-p0")["pd_npus"] = value
        plan_of(f)   # no exception
