"""plugin_utils.model: normalization, placement, offload arithmetic, shm, launch specs, proxy spec.

Expected values come from the inputs written in each test, from plugins/plugin_utils/data/defaults.yml read
here independently, or from the article's numbers in DOMAIN.md (200 GiB over 8 NPUs = 26843545600).
"""

import copy
import json
import os

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import launch, model
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

GIB = 1024 ** 3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
MODEL_PATH = "/data/models/DeepSeek-V4-Flash"

with open(os.path.join(REPO, "plugins", "plugin_utils", "data", "defaults.yml"), encoding="utf-8") as _fh:
    DEFAULTS = yaml.safe_load(_fh)


# ---- helpers ------------------------------------------------------------------------------------

def raw_cluster(name="cluster_a", version="0.25.1", prefill=None, decode=None, **top):
    """A pd_cluster dict as an operator writes it in group_vars (only what differs from defaults)."""
    raw = {"name": name, "vllm_ascend_version": version, "image": f"quay.io/ascend/vllm-ascend:v{version}",
           "model": {"path": MODEL_PATH}}
    raw.update(top)
    if prefill is not None:
        raw["prefill"] = prefill
    if decode is not None:
        raw["decode"] = decode
    return raw


def article_raw(**top):
    """The article's cluster: P + OffloadingConnector 200GiB, D + Recompute 200GiB + scheduler."""
    return raw_cluster(
        prefill={"offload_connector": "OffloadingConnector", "cpu_offload": "200GiB"},
        decode={"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                "recompute_scheduler": True},
        **top)


def host(name, role, address, **hv):
    return model.host_record(name, role, dict({"pd_host_address": address, "pd_host_ram": "1TiB",
                                               "pd_hccl_if": "enp189s0f0"}, **hv))


def two_hosts():
    return [host("a-p0", "prefill", "10.0.0.11"), host("a-d0", "decode", "10.0.0.12")]


def plan(raw, hosts=None):
    """normalize -> topology -> every rank spec. Returns (cluster, topo, problems, {container: spec})."""
    cluster = model.normalize(raw["name"], raw)
    topo, problems = model.topology(cluster, hosts or two_hosts())
    specs = {}
    for inst in topo["instances"]:
        for rank in inst["ranks"]:
            spec = launch.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
            specs[spec["name"]] = spec
    return cluster, topo, problems, specs


def arg(command, flag):
    """The value following ``flag`` in an argv list."""
    assert command.count(flag) == 1, f"{flag} appears {command.count(flag)} times in {command}"
    return command[command.index(flag) + 1]


def arg_list(command, flag):
    """The values following ``flag`` up to the next ``--flag``."""
    start = command.index(flag) + 1
    out = []
    for item in command[start:]:
        if item.startswith("--"):
            break
        out.append(item)
    return out


def errors(problems):
    return [p for p in problems if p["level"] == "error"]


# ---- normalize ----------------------------------------------------------------------------------

def test_normalize_deep_merges_role_defaults_under_the_operator_values():
    raw = raw_cluster(prefill={"engine": {"max_num_seqs": 16}}, decode={"dp": 1, "engine": {"block_size": 128}})
    cluster = model.normalize("cluster_a", raw)
    pre, dec = cluster["roles"]["prefill"], cluster["roles"]["decode"]
    # the operator's values win
    assert pre["engine"]["max_num_seqs"] == 16
    assert dec["dp"] == 1
    assert dec["engine"]["block_size"] == 128
    # siblings of an overridden key keep their defaults (deep merge, not replace)
    assert pre["engine"]["block_size"] == DEFAULTS["role_common"]["engine"]["block_size"]
    assert pre["engine"]["gpu_memory_utilization"] == DEFAULTS["role_common"]["engine"]["gpu_memory_utilization"]
    # role-specific defaults beat role_common ones
    assert pre["engine"]["max_num_batched_tokens"] == DEFAULTS["prefill"]["engine"]["max_num_batched_tokens"]
    assert pre["engine"]["enable_prefix_caching"] is DEFAULTS["prefill"]["engine"]["enable_prefix_caching"]
    assert dec["engine"]["max_num_seqs"] == DEFAULTS["decode"]["engine"]["max_num_seqs"]
    # decode batched tokens left null: max_num_seqs x (1 + MTP tokens) = 48 x (1 + 1), upstream's D sizing
    assert DEFAULTS["decode"]["engine"]["max_num_batched_tokens"] is None
    assert dec["engine"]["max_num_batched_tokens"] == 48 * 2
    assert pre["port_base"] == DEFAULTS["prefill"]["port_base"]
    assert dec["kv_port"] == DEFAULTS["decode"]["kv_port"]
    assert dec["tp"] == DEFAULTS["role_common"]["tp"]
    assert pre["role"] == "prefill" and dec["role"] == "decode"


def test_normalize_deep_merges_cluster_defaults():
    cluster = model.normalize("cluster_a", raw_cluster(proxy={"port": 9000}, workload={"avg_prompt_tokens": 4096}))
    assert cluster["name"] == "cluster_a"
    assert cluster["proxy"]["port"] == 9000
    assert cluster["proxy"]["max_retries"] == DEFAULTS["cluster"]["proxy"]["max_retries"]
    assert cluster["workload"]["avg_prompt_tokens"] == 4096
    assert cluster["workload"]["p99_prompt_tokens"] == DEFAULTS["cluster"]["workload"]["p99_prompt_tokens"]
    assert cluster["model"] == {"path": MODEL_PATH, **DEFAULTS["cluster"]["model"]}
    # null in defaults.yml: the model family's connector, upstream's for DeepSeek-V4-Flash
    assert DEFAULTS["cluster"]["mooncake_connector"] is None
    assert cluster["mooncake_connector"] == "MooncakeHybridConnector"


def test_normalize_does_not_modify_the_inventory_dict():
    raw = article_raw()
    before = copy.deepcopy(raw)
    model.normalize("cluster_a", raw)
    assert raw == before


@pytest.mark.parametrize("written, expected", [
    ("200GiB", 200 * GIB),
    ("200 gib", 200 * GIB),        # one grammar, any letter case
    ("25 GiB", 25 * GIB),
    ("1.5TiB", 3 * 512 * GIB),
    (1073741824, GIB),
    (0, 0),
])
def test_normalize_turns_offload_sizes_into_bytes(written, expected):
    cluster = model.normalize("cluster_a", raw_cluster(decode={"cpu_offload": written}))
    assert cluster["roles"]["decode"]["cpu_offload_bytes"] == expected
    assert "cpu_offload" not in cluster["roles"]["decode"]


def test_normalize_turns_shm_sizes_into_bytes_and_keeps_auto():
    cluster = model.normalize("cluster_a", raw_cluster(prefill={"shm_size": "256GiB"}))
    assert cluster["roles"]["prefill"]["shm_size_bytes"] == 256 * GIB
    assert cluster["roles"]["decode"]["shm_size_bytes"] is None


@pytest.mark.parametrize("drop, field", [
    ("vllm_ascend_version", "vllm_ascend_version"),
    ("image", "image"),
    ("model", "model.path"),
])
def test_normalize_requires_version_image_and_model_path(drop, field):
    raw = raw_cluster(name="cluster_q")
    del raw[drop]
    with pytest.raises(PdError) as info:
        model.normalize("cluster_q", raw)
    err = info.value
    assert err.where == "cluster_q"
    assert err.field == field
    assert "required" in err.problem
    # the fix names the key to set and the file it belongs in
    assert f"pd_cluster.{field}" in err.fix
    assert "group_vars/cluster_q.yml" in err.fix
    assert str(err).startswith(f"cluster_q: {field}: ")


def test_normalize_names_the_role_field_of_an_unreadable_size():
    with pytest.raises(PdError) as info:
        model.normalize("cluster_a", raw_cluster(decode={"cpu_offload": "lots"}))
    assert info.value.where == "cluster_a/decode"
    assert info.value.field == "decode.cpu_offload"
    assert "lots" in info.value.problem


def test_normalize_refuses_zero_instances():
    with pytest.raises(PdError) as info:
        model.normalize("cluster_a", raw_cluster(prefill={"instances": 0}))
    assert info.value.field == "prefill.instances"
    assert info.value.fix


def test_host_record_defaults_and_overrides():
    rec = model.host_record("h1", "decode", {"ansible_host": "10.1.1.1", "pd_host_ram": "512GiB",
                                             "pd_hccl_if": "eth1"})
    assert rec["address"] == "10.1.1.1"            # ansible_host when pd_host_address is unset
    assert rec["ram_bytes"] == 512 * GIB
    assert rec["npus"] == DEFAULTS["host"]["npus"]
    assert rec["hbm_per_npu_bytes"] == 64 * GIB
    assert model.host_record("h3", "decode", {"ansible_host": "x", "pd_host_address": "10.9.9.9",
                                              "pd_host_ram": "1TiB", "pd_hccl_if": "eth1"})["address"] == "10.9.9.9"


@pytest.mark.parametrize("hv, field", [
    ({"pd_host_ram": "1TiB", "pd_hccl_if": "eth1"}, "pd_host_address"),          # was: the host name
    ({"ansible_host": "node-7", "pd_host_ram": "1TiB", "pd_hccl_if": "eth1"}, "ansible_host"),  # not an IP
    ({"pd_host_address": "10.0.0.1", "pd_hccl_if": "eth1"}, "pd_host_ram"),       # was: 1 TiB
    ({"pd_host_address": "10.0.0.1", "pd_host_ram": "1TiB"}, "pd_hccl_if"),       # was: eth0
])
def test_host_record_has_no_silent_default_for_required_facts(hv, field):
    with pytest.raises(PdError) as info:
        model.host_record("h2", "decode", hv)
    assert info.value.where == "h2" and info.value.field == field


# ---- topology -----------------------------------------------------------------------------------

def test_ranks_fill_the_role_hosts_in_order_with_npus_over_tp_per_host():
    # 2 P instances of DP2 x TP4 on two 8-NPU hosts: 8 // 4 = 2 ranks per host, instance 0 first
    hosts = [host("p0", "prefill", "10.0.0.1"), host("p1", "prefill", "10.0.0.2"), host("d0", "decode", "10.0.0.3")]
    cluster, topo, problems, _ = plan(raw_cluster(prefill={"instances": 2}), hosts)
    assert errors(problems) == []
    pre = [i for i in topo["instances"] if i["role"] == "prefill"]
    assert [[r["host"] for r in i["ranks"]] for i in pre] == [["p0", "p0"], ["p1", "p1"]]
    assert [len(topo["hosts"][h]["ranks"]) for h in ("p0", "p1", "d0")] == [2, 2, 2]


def test_tp8_puts_one_rank_per_8_npu_host():
    hosts = [host("p0", "prefill", "10.0.0.1"), host("p1", "prefill", "10.0.0.2"), host("d0", "decode", "10.0.0.3")]
    _, topo, problems, _ = plan(raw_cluster(prefill={"dp": 2, "tp": 8}, decode={"dp": 1, "tp": 8}), hosts)
    assert errors(problems) == []
    pre = next(i for i in topo["instances"] if i["role"] == "prefill")
    assert [(r["host"], r["devices"]) for r in pre["ranks"]] == [("p0", list(range(8))), ("p1", list(range(8)))]
    assert pre["hosts"] == ["p0", "p1"]


def test_devices_ports_and_kv_ports_per_rank_and_instance():
    # 2 D instances of DP2 x TP4 on two 8-NPU decode hosts
    port_base, kv_port, rpc = 8300, 31000, 14000
    hosts = [host("p0", "prefill", "10.0.0.1"), host("d0", "decode", "10.0.0.2"), host("d1", "decode", "10.0.0.3")]
    _, topo, problems, _ = plan(raw_cluster(decode={"instances": 2, "dp": 2, "tp": 4, "port_base": port_base,
                                                    "kv_port": kv_port, "dp_rpc_port": rpc}), hosts)
    assert errors(problems) == []
    dec = [i for i in topo["instances"] if i["role"] == "decode"]
    dp, tp = 2, 4
    for i, inst in enumerate(dec):
        assert inst["kv_port"] == kv_port + i * dp * tp
        assert inst["dp_rpc_port"] == rpc + i
        for r, rank in enumerate(inst["ranks"]):
            assert rank["dp_rank"] == r
            assert rank["port"] == port_base + i * dp + r
            # within a host, slot s gets devices s*tp .. (s+1)*tp-1
            assert rank["devices"] == list(range(r * tp, (r + 1) * tp))
            assert rank["container"] == f"pd-cluster_a-decode{i}-dp{r}"
    assert [r["port"] for i in dec for r in i["ranks"]] == [8300, 8301, 8302, 8303]
    assert [i["kv_port"] for i in dec] == [31000, 31008]


def test_no_engine_id_in_the_plan_or_the_launch_spec():
    """issue 20 #2: the engine gives each process its own engine id (docs/design.md "Engine ids are
    born with the process"); a fixed one in the plan would reach the argv and the spec hash."""
    hosts = [host("p0", "prefill", "10.0.0.1"), host("p1", "prefill", "10.0.0.2"),
             host("d0", "decode", "10.0.0.3"), host("d1", "decode", "10.0.0.4")]
    _, topo, _, specs = plan(raw_cluster(prefill={"instances": 2}, decode={"instances": 2}), hosts)
    assert [i for i in topo["instances"] if "engine_id" in i] == []
    assert len(specs) == 8
    for spec in specs.values():
        assert "engine_id" not in spec
        kv = json.loads(arg(spec["command"], "--kv-transfer-config"))
        assert "engine_id" not in json.dumps(kv), spec["name"]


def test_decode_instance_spans_two_hosts_cluster_b_style():
    hosts = [host("b-p0", "prefill", "10.0.1.11"), host("b-d0", "decode", "10.0.1.12"),
             host("b-d1", "decode", "10.0.1.13")]
    _, topo, problems, specs = plan(raw_cluster(name="cluster_b", decode={"dp": 4, "tp": 4}), hosts)
    assert errors(problems) == []
    dec = next(i for i in topo["instances"] if i["role"] == "decode")
    assert dec["hosts"] == ["b-d0", "b-d1"]
    assert [(r["dp_rank"], r["host"], r["devices"]) for r in dec["ranks"]] == [
        (0, "b-d0", [0, 1, 2, 3]), (1, "b-d0", [4, 5, 6, 7]),
        (2, "b-d1", [0, 1, 2, 3]), (3, "b-d1", [4, 5, 6, 7])]
    # every rank of the instance talks to the DP master on the first host
    assert dec["dp_address"] == "10.0.1.12"
    for r in range(4):
        cmd = specs[f"pd-cluster_b-decode0-dp{r}"]["command"]
        assert arg(cmd, "--data-parallel-address") == "10.0.1.12"
        assert arg(cmd, "--data-parallel-size") == "4"
        assert arg(cmd, "--data-parallel-rank") == str(r)
    assert specs["pd-cluster_b-decode0-dp3"]["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert specs["pd-cluster_b-decode0-dp3"]["env"]["HCCL_IF_IP"] == "10.0.1.13"


def test_npu_first_offsets_the_device_numbers():
    hosts = [host("p0", "prefill", "10.0.0.1"), host("d0", "decode", "10.0.0.2", pd_npu_first=8)]
    _, topo, _, _ = plan(raw_cluster(), hosts)
    dec = next(i for i in topo["instances"] if i["role"] == "decode")
    assert [r["devices"] for r in dec["ranks"]] == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_too_few_npus_is_an_error_naming_the_need_and_the_hosts():
    # 2 instances x DP2 x TP4 = 16 NPUs wanted from one 8-NPU decode host
    _, _, problems, _ = plan(raw_cluster(decode={"instances": 2}))
    found = [p for p in errors(problems) if p["field"] == "decode.instances"]
    assert len(found) == 1
    assert found[0]["where"] == "cluster_a/decode"
    assert "16 NPUs" in found[0]["message"] and "8 usable" in found[0]["message"]
    assert "a-d0" in found[0]["message"]
    assert "add hosts" in found[0]["fix"]


def test_no_host_in_a_role_is_reported():
    _, _, problems, _ = plan(raw_cluster(), [host("a-p0", "prefill", "10.0.0.11")])
    found = [p for p in errors(problems) if p["field"] == "decode.instances"]
    assert found and "none" in found[0]["message"]


def test_tp_not_dividing_the_host_is_an_error_at_that_host():
    _, _, problems, _ = plan(raw_cluster(prefill={"tp": 16, "dp": 1}))
    found = [p for p in errors(problems) if p["field"] == "prefill.tp"]
    assert len(found) == 1
    assert found[0]["where"] == "cluster_a/prefill@a-p0"
    assert "16" in found[0]["message"] and "8 NPUs" in found[0]["message"]


def test_spare_npu_slots_are_a_warning_not_an_error():
    _, _, problems, _ = plan(raw_cluster(prefill={"dp": 1}))
    assert errors(problems) == []
    warn = [p for p in problems if p["level"] == "warning" and p["field"] == "prefill.instances"]
    assert len(warn) == 1 and "1 DP slot" in warn[0]["message"]


def test_good_topology_has_no_problems():
    _, _, problems, _ = plan(article_raw())
    assert problems == []


# ---- offload arithmetic -------------------------------------------------------------------------

def kv_config(spec):
    return json.loads(arg(spec["command"], "--kv-transfer-config"))


def child(config, name):
    kids = config["kv_connector_extra_config"]["connectors"]
    return next(c for c in kids if c["kv_connector"] == name)


def test_decode_recompute_200gib_over_8_npus_is_the_articles_per_rank_value():
    cluster, topo, _, specs = plan(article_raw())
    spec = specs["pd-cluster_a-decode0-dp0"]
    per_rank = child(kv_config(spec), "RecomputeCPUOffloadConnector")["kv_connector_extra_config"][
        "cpu_bytes_to_use_per_rank"]
    assert per_rank == 26843545600 == 200 * GIB // 8
    # a container runs tp NPU ranks, each pinning per_rank bytes
    assert spec["pinned_offload_bytes"] == per_rank * 4
    assert model.offload_bytes(cluster, "decode", topo["hosts"]["a-d0"]) == (26843545600, 4 * 26843545600)


def test_prefill_offloading_splits_the_host_total_over_its_engines():
    cluster, topo, _, specs = plan(article_raw())
    # DP2 on the host: two engines share 200GiB
    for r in range(2):
        spec = specs[f"pd-cluster_a-prefill0-dp{r}"]
        extra = child(kv_config(spec), "OffloadingConnector")["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] == 200 * GIB // 2
        assert spec["pinned_offload_bytes"] == 200 * GIB // 2
    assert model.offload_bytes(cluster, "prefill", topo["hosts"]["a-p0"]) == (100 * GIB, 100 * GIB)


def test_prefill_tp8_single_engine_gets_the_whole_host_total():
    _, _, _, specs = plan(article_raw() | {"prefill": {"dp": 1, "tp": 8, "offload_connector": "OffloadingConnector",
                                                       "cpu_offload": "200GiB"}})
    spec = specs["pd-cluster_a-prefill0-dp0"]
    assert child(kv_config(spec), "OffloadingConnector")["kv_connector_extra_config"]["cpu_bytes_to_use"] == 200 * GIB


def test_offload_is_per_instance_a_host_with_a_spare_slot_pins_one_instances_share():
    # DP1 x TP4 on an 8-NPU host: one engine, four NPUs; cpu_offload is what one instance pins
    raw = raw_cluster(prefill={"dp": 1, "offload_connector": "OffloadingConnector", "cpu_offload": "200GiB"},
                      decode={"dp": 1, "offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                              "recompute_scheduler": True})
    _, _, _, specs = plan(raw)
    pre, dec = specs["pd-cluster_a-prefill0-dp0"], specs["pd-cluster_a-decode0-dp0"]
    assert child(kv_config(pre), "OffloadingConnector")["kv_connector_extra_config"]["cpu_bytes_to_use"] == 200 * GIB
    per_rank = child(kv_config(dec), "RecomputeCPUOffloadConnector")["kv_connector_extra_config"][
        "cpu_bytes_to_use_per_rank"]
    assert per_rank == 200 * GIB // 4
    assert pre["pinned_offload_bytes"] == dec["pinned_offload_bytes"] == 200 * GIB


def test_an_instance_spanning_two_hosts_splits_its_offload_over_them():
    # DP2 x TP4 on two 4-NPU decode hosts: one instance, 200GiB over its 8 NPUs, 100GiB pinned per host
    raw = raw_cluster(decode={"dp": 2, "offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                              "recompute_scheduler": True})
    hosts = [host("a-p0", "prefill", "10.0.0.11"), host("a-d0", "decode", "10.0.0.12", pd_npus=4),
             host("a-d1", "decode", "10.0.0.13", pd_npus=4)]
    _, _, _, specs = plan(raw, hosts)
    for name in ("pd-cluster_a-decode0-dp0", "pd-cluster_a-decode0-dp1"):
        assert child(kv_config(specs[name]), "RecomputeCPUOffloadConnector")["kv_connector_extra_config"][
            "cpu_bytes_to_use_per_rank"] == 26843545600
        assert specs[name]["pinned_offload_bytes"] == 100 * GIB
    assert {specs[n]["host"] for n in ("pd-cluster_a-decode0-dp0", "pd-cluster_a-decode0-dp1")} == {"a-d0", "a-d1"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_scaling_a_role_out_and_in_leaves_the_other_instances_launch_specs_unchanged(role):
    """Elastic scale starts or removes only the changed instance's ranks (docs/guide/scale.md):
    the offload budget is per instance, so the running instance's spec hash does not move."""
    def cluster_with(instances):
        roles = {"prefill": {"dp": 1, "offload_connector": "OffloadingConnector", "cpu_offload": "64GiB"},
                 "decode": {"dp": 1, "offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "64GiB",
                            "recompute_scheduler": True}}
        roles[role]["instances"] = instances
        return plan(raw_cluster(version="main", image="quay.io/ascend/vllm-ascend:nightly-main", **roles))[3]

    one, two = cluster_with(1), cluster_with(2)
    existing = f"pd-cluster_a-{role}0-dp0"
    assert f"pd-cluster_a-{role}1-dp0" in two and f"pd-cluster_a-{role}1-dp0" not in one
    assert launch.spec_hash(one[existing]) == launch.spec_hash(two[existing])
    assert one[existing]["pinned_offload_bytes"] == two[f"pd-cluster_a-{role}1-dp0"]["pinned_offload_bytes"] > 0
    # nor the other role's: no engine id is rendered (the engine makes one per process), so scaling
    # prefill no longer renumbers decode as upstream's tutorial numbering (prefill first) did
    other = "decode" if role == "prefill" else "prefill"
    assert launch.spec_hash(one[f"pd-cluster_a-{other}0-dp0"]) == launch.spec_hash(two[f"pd-cluster_a-{other}0-dp0"])


def test_no_offload_means_no_offload_child_and_nothing_pinned():
    cluster, topo, _, specs = plan(raw_cluster())
    assert model.offload_bytes(cluster, "decode", topo["hosts"]["a-d0"]) == (None, 0)
    for spec in specs.values():
        assert spec["pinned_offload_bytes"] == 0
        assert "Offload" not in arg(spec["command"], "--kv-transfer-config")


def test_offload_that_does_not_divide_over_the_npus_is_refused():
    raw = raw_cluster(decode={"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": 7,
                              "recompute_scheduler": True})
    cluster = model.normalize("cluster_a", raw)
    topo, _ = model.topology(cluster, two_hosts())
    with pytest.raises(PdError) as info:
        model.offload_bytes(cluster, "decode", topo["hosts"]["a-d0"])
    assert "a-d0" in info.value.where


# ---- shm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pinned_gib, shm_gib", [
    (200, 256),      # the article: 200 GB of pinned offload -> --shm-size=256g
    (100, 128),
    (25, 32),
    (64, 82),        # 64 x 1.28 = 81.92 -> rounded up to whole GiB
    (10, 16),        # 12.8 -> 13, below the 16GiB floor
    (0, 16),
])
def test_auto_shm_is_pinned_times_1_28_rounded_up_with_a_16gib_floor(pinned_gib, shm_gib):
    assert model.shm_bytes({"shm_size_bytes": None}, pinned_gib * GIB) == shm_gib * GIB


def test_auto_shm_of_the_article_is_274877906944_bytes():
    assert model.shm_bytes({"shm_size_bytes": None}, 200 * GIB) == 274877906944


@pytest.mark.parametrize("explicit", [300 * GIB, 8 * GIB])
def test_explicit_shm_is_kept_as_written(explicit):
    # even below the pinned bytes: rules report that, the model does not silently change it
    assert model.shm_bytes({"shm_size_bytes": explicit}, 100 * GIB) == explicit


def test_rank_spec_carries_auto_and_explicit_shm():
    raw = article_raw()
    raw["prefill"]["shm_size"] = "300GiB"
    _, _, _, specs = plan(raw)
    # decode: pinned 100GiB per container -> auto 128GiB; prefill: the operator's 300GiB
    assert specs["pd-cluster_a-decode0-dp0"]["shm_size_bytes"] == 128 * GIB
    assert specs["pd-cluster_a-prefill0-dp1"]["shm_size_bytes"] == 300 * GIB


# ---- rank_spec argv -----------------------------------------------------------------------------

def test_argv_starts_vllm_serve_with_the_model_and_rank_flags():
    _, _, _, specs = plan(article_raw())
    spec = specs["pd-cluster_a-prefill0-dp1"]
    cmd = spec["command"]
    assert cmd[:3] == ["vllm", "serve", MODEL_PATH]
    assert arg(cmd, "--port") == "8101"
    assert arg(cmd, "--data-parallel-rank") == "1"
    assert arg(cmd, "--data-parallel-size") == "2"
    assert arg(cmd, "--tensor-parallel-size") == "4"
    assert arg(cmd, "--data-parallel-rpc-port") == "13389"
    assert arg(cmd, "--data-parallel-address") == "10.0.0.11"
    assert arg(cmd, "--served-model-name") == "deepseek-v4-flash"
    assert all(isinstance(a, str) for a in cmd)
    # the second rank's host NPUs 4..7; the container mounts all 8 under their own names
    assert spec["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    davinci = [d for d in spec["devices"] if "/dev/davinci" in d and "manager" not in d]
    assert davinci == [f"/dev/davinci{n}:/dev/davinci{n}" for n in range(8)]
    assert f"{MODEL_PATH}:{MODEL_PATH}:ro" in spec["volumes"]
    assert spec["health_url"] == "http://127.0.0.1:8101/health"
    assert spec["network_mode"] == "host" and spec["privileged"] is False


# ---- device numbering (issue 10 #1) -------------------------------------------------------------

def container_view(spec):
    """(host NPU numbers the container mounts, in the order the runtime numbers them from 0,
    and the NPU ids ASCEND_RT_VISIBLE_DEVICES names). Inside a container the NPUs it was given are
    numbered 0..n-1 (vllm-ascend PR 12959's note; the 'input data rang[0-2)' report of issue 10)."""
    mounted = sorted(int(d.split(":")[1].rsplit("davinci", 1)[1]) for d in spec["devices"]
                     if d.split(":")[1].startswith("/dev/davinci") and d.split(":")[1][12:].isdigit())
    visible = [int(x) for x in spec["env"]["ASCEND_RT_VISIBLE_DEVICES"].split(",")]
    return mounted, visible


@pytest.mark.parametrize("hosts, raw", [
    (None, article_raw()),
    ([host("p0", "prefill", "10.0.0.1"), host("d0", "decode", "10.0.0.2"), host("d1", "decode", "10.0.0.3")],
     raw_cluster(decode={"dp": 4, "tp": 4})),
    ([host("p0", "prefill", "10.0.0.1", pd_npus=16), host("d0", "decode", "10.0.0.2", pd_npus=16)],
     raw_cluster(prefill={"dp": 4, "tp": 4}, decode={"dp": 16, "tp": 1})),
    ([host("p0", "prefill", "10.0.0.1"), host("d0", "decode", "10.0.0.2", pd_npu_first=8)],
     raw_cluster()),
    ([host("p0", "prefill", "10.0.0.1"), host("d0", "decode", "10.0.0.2")],
     raw_cluster(prefill={"instances": 2, "dp": 1}, decode={"dp": 8, "tp": 1})),
])
def test_every_visible_device_exists_in_its_container_and_is_the_ranks_npu(hosts, raw):
    # Fails on the layout of one container per rank with only its own davinciN mounted: the second
    # rank's "4,5,6,7" names devices a 4-device container does not have.
    _, topo, problems, specs = plan(raw, hosts)
    assert [p for p in problems if p["level"] == "error"] == []
    ranks = {r["container"]: r for i in topo["instances"] for r in i["ranks"]}
    for name, spec in specs.items():
        mounted, visible = container_view(spec)
        assert visible and all(0 <= v < len(mounted) for v in visible), (name, mounted, visible)
        # container id v is the v-th mounted node: the rank's own host NPUs, in order
        assert [mounted[v] for v in visible] == ranks[name]["devices"], name


def test_ranks_on_one_host_mount_the_same_devices_and_name_disjoint_slices():
    _, _, _, specs = plan(article_raw())
    pre = [specs[f"pd-cluster_a-prefill0-dp{r}"] for r in (0, 1)]
    assert pre[0]["devices"] == pre[1]["devices"]
    assert [container_view(s)[1] for s in pre] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_argv_of_a_single_dp_rank_has_no_external_dp_flags():
    # vLLM 0.27.1 refuses --data-parallel-rank when the DP size is 1 ("data_parallel_external_lb can
    # only be set when data_parallel_size > 1", vllm/config/parallel.py); seen on the real CPU engine
    _, _, _, specs = plan(raw_cluster(prefill={"dp": 1, "tp": 4}, decode={"dp": 1, "tp": 8}))
    for name in ("pd-cluster_a-prefill0-dp0", "pd-cluster_a-decode0-dp0"):
        cmd = specs[name]["command"]
        assert not [a for a in cmd if a.startswith("--data-parallel")], cmd
        assert arg(cmd, "--tensor-parallel-size") in ("4", "8")


def test_additional_config_only_on_decode_with_recompute_scheduler():
    _, _, _, specs = plan(article_raw())
    for name, spec in specs.items():
        add = json.loads(arg(spec["command"], "--additional-config"))   # V4 recipe options on both
        assert "recompute_scheduler_enable" not in add, name
        if spec["role"] == "decode":
            assert add["scheduler_config"] == {"recompute_scheduler_enable": True}
        else:
            assert "scheduler_config" not in add, name


def test_additional_config_uses_the_top_level_key_on_v0_23():
    _, _, _, specs = plan(article_raw(version="0.23.0"))
    add = json.loads(arg(specs["pd-cluster_a-decode0-dp0"]["command"], "--additional-config"))
    assert add["recompute_scheduler_enable"] is True and "scheduler_config" not in add


def test_no_additional_config_without_recompute_scheduler():
    # a generic model has no recipe options, so nothing is left for --additional-config
    _, _, _, specs = plan(raw_cluster(model={"path": MODEL_PATH, "family": "generic"}))
    assert all("--additional-config" not in s["command"] for s in specs.values())


def test_prefix_caching_flags_and_retention_env():
    _, _, _, specs = plan(article_raw())
    pre, dec = specs["pd-cluster_a-prefill0-dp0"], specs["pd-cluster_a-decode0-dp0"]
    assert "--enable-prefix-caching" in pre["command"] and "--no-enable-prefix-caching" not in pre["command"]
    assert "--no-enable-prefix-caching" in dec["command"] and "--enable-prefix-caching" not in dec["command"]
    assert pre["env"]["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == str(
        DEFAULTS["prefill"]["engine"]["prefix_cache_retention_interval"])
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" not in dec["env"]


def test_retention_env_follows_the_configured_interval():
    engine = {"block_size": 128, "prefix_cache_retention_interval": 16384}
    _, _, _, specs = plan(raw_cluster(prefill={"engine": engine}))
    pre = specs["pd-cluster_a-prefill0-dp0"]
    assert pre["env"]["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "16384"
    assert arg(pre["command"], "--block-size") == "128"


def test_hybrid_kv_cache_manager_stays_on_by_default():
    _, _, _, specs = plan(raw_cluster(decode={"engine": {"disable_hybrid_kv_cache_manager": True}}))
    pre, dec = specs["pd-cluster_a-prefill0-dp0"], specs["pd-cluster_a-decode0-dp0"]
    assert "--no-disable-hybrid-kv-cache-manager" in pre["command"]
    assert "--disable-hybrid-kv-cache-manager" not in pre["command"]
    assert "--disable-hybrid-kv-cache-manager" in dec["command"]
    assert "--no-disable-hybrid-kv-cache-manager" not in dec["command"]


def test_partial_prefill_flags_only_when_not_1():
    raw = raw_cluster(prefill={"engine": {"max_num_partial_prefills": 2, "max_long_partial_prefills": 1,
                                          "long_prefill_token_threshold": 4096}})
    _, _, _, specs = plan(raw)
    pre, dec = specs["pd-cluster_a-prefill0-dp0"]["command"], specs["pd-cluster_a-decode0-dp0"]["command"]
    assert arg(pre, "--max-num-partial-prefills") == "2"
    assert arg(pre, "--max-long-partial-prefills") == "1"
    assert arg(pre, "--long-prefill-token-threshold") == "4096"
    for flag in ("--max-num-partial-prefills", "--max-long-partial-prefills", "--long-prefill-token-threshold"):
        assert flag not in dec


def test_engine_values_reach_the_argv():
    raw = raw_cluster(decode={"engine": {"max_num_seqs": 40, "max_num_batched_tokens": 160, "max_model_len": 30000,
                                         "gpu_memory_utilization": 0.8, "extra_args": ["--seed", 7]}})
    _, _, _, specs = plan(raw)
    cmd = specs["pd-cluster_a-decode0-dp1"]["command"]
    assert arg(cmd, "--max-num-seqs") == "40"
    assert arg(cmd, "--max-num-batched-tokens") == "160"
    assert arg(cmd, "--max-model-len") == "30000"
    assert arg(cmd, "--gpu-memory-utilization") == "0.8"
    assert cmd[-2:] == ["--seed", "7"]


def test_ascend_root_prefixes_device_and_mount_sources_only():
    hosts = [host("a-p0", "prefill", "10.0.0.11"), host("a-d0", "decode", "10.0.0.12", pd_ascend_root="/fake/")]
    _, _, _, specs = plan(raw_cluster(), hosts)
    dec = specs["pd-cluster_a-decode0-dp0"]
    assert "/fake/dev/davinci0:/dev/davinci0" in dec["devices"]
    assert "/fake/dev/davinci_manager:/dev/davinci_manager" in dec["devices"]
    assert "/fake/usr/local/dcmi:/usr/local/dcmi:ro" in dec["volumes"]
    # the model directory is not under the driver root
    assert f"{MODEL_PATH}:{MODEL_PATH}:ro" in dec["volumes"]


# ---- spec hash ----------------------------------------------------------------------------------

def test_spec_hash_label_is_stable_across_renders():
    _, _, _, first = plan(article_raw())
    _, _, _, second = plan(article_raw())
    for name, spec in first.items():
        assert spec["labels"]["pd.spec-hash"] == second[name]["labels"]["pd.spec-hash"]
        assert spec["labels"]["pd.spec-hash"] == launch.spec_hash(spec)
    assert len({s["labels"]["pd.spec-hash"] for s in first.values()}) == len(first)


def test_spec_hash_ignores_key_order_and_labels():
    _, _, _, specs = plan(article_raw())
    spec = specs["pd-cluster_a-decode0-dp0"]
    reordered = dict(reversed(list(spec.items())))
    assert launch.spec_hash(reordered) == launch.spec_hash(spec)
    relabelled = dict(spec, labels={"anything": "else"})
    assert launch.spec_hash(relabelled) == launch.spec_hash(spec)


@pytest.mark.parametrize("change", [
    lambda s: s["command"].append("--enforce-eager"),
    lambda s: s["env"].update(HCCL_BUFFSIZE="2048"),
    lambda s: s.update(image="quay.io/ascend/vllm-ascend:v0.25.2"),
    lambda s: s.update(shm_size_bytes=s["shm_size_bytes"] + GIB),
    lambda s: s["devices"].pop(),
    lambda s: s["volumes"].append("/x:/x:ro"),
    lambda s: s["ports"].update(http=9999),
    lambda s: s.update(privileged=True),
    lambda s: s.update(restart_policy="always"),
    lambda s: s.update(pinned_offload_bytes=0),
], ids=["command", "env", "image", "shm", "devices", "volumes", "ports", "privileged", "restart", "pinned"])
def test_spec_hash_changes_when_any_field_changes(change):
    _, _, _, specs = plan(article_raw())
    spec = specs["pd-cluster_a-decode0-dp0"]
    changed = copy.deepcopy(spec)
    change(changed)
    assert launch.spec_hash(changed) != launch.spec_hash(spec)


def test_inventory_change_restarts_only_the_ranks_it_touches():
    _, _, _, before = plan(article_raw())
    raw = article_raw()
    raw["decode"]["engine"] = {"max_num_seqs": 40}
    _, _, _, after = plan(raw)
    for name in before:
        same = before[name]["labels"]["pd.spec-hash"] == after[name]["labels"]["pd.spec-hash"]
        assert same == (before[name]["role"] == "prefill"), name


# ---- proxy spec ---------------------------------------------------------------------------------

def test_proxy_lists_every_prefill_and_decode_rank():
    hosts = [host("b-p0", "prefill", "10.0.1.11"), host("b-d0", "decode", "10.0.1.12"),
             host("b-d1", "decode", "10.0.1.13")]
    raw = raw_cluster(name="cluster_b", decode={"dp": 4}, proxy={"port": 8010, "max_retries": 5})
    cluster = model.normalize("cluster_b", raw)
    topo, _ = model.topology(cluster, hosts)
    spec = launch.proxy_spec(cluster, topo)
    cmd = spec["command"]
    p_hosts, p_ports = arg_list(cmd, "--prefiller-hosts"), arg_list(cmd, "--prefiller-ports")
    d_hosts, d_ports = arg_list(cmd, "--decoder-hosts"), arg_list(cmd, "--decoder-ports")
    assert len(p_hosts) == len(p_ports) == 2
    assert len(d_hosts) == len(d_ports) == 4
    assert list(zip(p_hosts, p_ports)) == [("10.0.1.11", "8100"), ("10.0.1.11", "8101")]
    assert list(zip(d_hosts, d_ports)) == [("10.0.1.12", "8200"), ("10.0.1.12", "8201"),
                                           ("10.0.1.13", "8202"), ("10.0.1.13", "8203")]
    assert arg(cmd, "--port") == "8010"
    assert arg(cmd, "--max-retries") == "5"
    # default host: the first prefill host
    assert spec["host"] == "b-p0"
    assert spec["health_url"] == "http://127.0.0.1:8010/healthcheck"
    assert spec["labels"]["pd.spec-hash"] == launch.spec_hash(spec)


def test_proxy_host_can_be_chosen_and_must_be_in_the_cluster():
    cluster = model.normalize("cluster_a", raw_cluster(proxy={"host": "a-d0"}))
    topo, _ = model.topology(cluster, two_hosts())
    assert launch.proxy_spec(cluster, topo)["host"] == "a-d0"
    cluster = model.normalize("cluster_a", raw_cluster(proxy={"host": "elsewhere"}))
    topo, _ = model.topology(cluster, two_hosts())
    with pytest.raises(PdError) as info:
        launch.proxy_spec(cluster, topo)
    assert info.value.field == "proxy.host"
    assert "a-p0" in info.value.fix and "a-d0" in info.value.fix


# ---- issue 10 #3: the model family's recipe -------------------------------------------------------

V4_ONLY_FLAGS = ("--tokenizer-mode", "--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser",
                 "--enable-expert-parallel", "--quantization", "--speculative-config", "--compilation-config")


def test_v4_recipe_flags_per_role():
    """DeepSeek-V4-Flash tutorial (A2 PD): P eager with MTP 1 (eager), D FULL_DECODE_ONLY with MTP."""
    _, _, _, specs = plan(article_raw(version="main"))
    pre, dec = specs["pd-cluster_a-prefill0-dp0"]["command"], specs["pd-cluster_a-decode0-dp0"]["command"]
    for cmd in (pre, dec):
        assert arg(cmd, "--tokenizer-mode") == "deepseek_v4"
        assert arg(cmd, "--tool-call-parser") == "deepseek_v4" == arg(cmd, "--reasoning-parser")
        assert "--enable-auto-tool-choice" in cmd and "--enable-expert-parallel" in cmd
        assert arg(cmd, "--quantization") == "ascend"
        assert json.loads(arg(cmd, "--speculative-config")) == {
            "num_speculative_tokens": 1, "method": "mtp", "enforce_eager": True}
    assert "--enforce-eager" in pre and "--compilation-config" not in pre
    assert "--enforce-eager" not in dec
    assert json.loads(arg(dec, "--compilation-config")) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    # D batched tokens derived: 48 seqs x (1 + 1)
    assert arg(dec, "--max-num-batched-tokens") == "96"


def test_generic_family_renders_a_plain_model():
    raw = raw_cluster(version="main", model={"path": MODEL_PATH, "family": "generic"},
                      prefill={"engine": {"enforce_eager": True}}, decode={"engine": {"enforce_eager": True}})
    cluster, _, _, specs = plan(raw)
    assert cluster["mooncake_connector"] == "MooncakeConnectorV1"
    for name, spec in specs.items():
        if spec["kind"] != "engine":
            continue
        assert not [f for f in V4_ONLY_FLAGS if f in spec["command"]], name
        assert "--enforce-eager" in spec["command"], name
        assert "LD_PRELOAD" not in spec["env"] and "HCCL_OP_EXPANSION_MODE" not in spec["env"], name
    # no draft tokens: decode batches one token per sequence
    assert arg(specs["pd-cluster_a-decode0-dp0"]["command"], "--max-num-batched-tokens") == "48"


def test_recipe_items_are_overridden_per_cluster():
    raw = raw_cluster(version="main", recipe={"quantization": False, "tokenizer_mode": "auto"},
                      mooncake_connector="MooncakeConnectorV1",
                      decode={"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                              "recompute_scheduler": True,
                              "engine": {"num_speculative_tokens": 3, "cudagraph_mode": False,
                                         "additional_config": {}}})
    _, _, _, specs = plan(raw)
    dec = specs["pd-cluster_a-decode0-dp0"]["command"]
    assert "--quantization" not in dec and arg(dec, "--tokenizer-mode") == "auto"
    assert "--compilation-config" not in dec
    assert json.loads(arg(dec, "--speculative-config"))["num_speculative_tokens"] == 3
    assert arg(dec, "--max-num-batched-tokens") == str(48 * 4)
    assert json.loads(arg(dec, "--additional-config")) == {"scheduler_config": {"recompute_scheduler_enable": True}}
    assert json.loads(arg(dec, "--kv-transfer-config"))["kv_connector_extra_config"]["connectors"][0][
        "kv_connector"] == "MooncakeConnectorV1"


def test_env_parity_and_no_dead_variables():
    _, _, _, specs = plan(article_raw(version="main"))
    for spec in (specs["pd-cluster_a-prefill0-dp0"], specs["pd-cluster_a-decode0-dp0"]):
        env = spec["env"]
        # vLLM PR 44128: no V1 release reads VLLM_RPC_TIMEOUT
        assert "VLLM_RPC_TIMEOUT" not in env
        assert env["HCCL_OP_EXPANSION_MODE"] == "AIV"
        assert int(env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]) > 1836   # above HCCL's operator timeout
        assert env["HCCL_CONNECT_TIMEOUT"] == "1200" and env["HCCL_BUFFSIZE"] == "1024"
        # the image only preloads jemalloc from ~/.bashrc, which docker run <cmd> never reads
        assert env["LD_PRELOAD"] == "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"
    _, _, _, specs = plan(raw_cluster(version="main", recipe={"allocator_preload": False},
                                      prefill={"offload_connector": "OffloadingConnector", "cpu_offload": "200GiB",
                                               "env": {"HCCL_BUFFSIZE": "2560"}}))
    assert "LD_PRELOAD" not in specs["pd-cluster_a-prefill0-dp0"]["env"]
    assert specs["pd-cluster_a-prefill0-dp0"]["env"]["HCCL_BUFFSIZE"] == "2560"   # role env wins


def test_unknown_family_is_refused_by_name():
    with pytest.raises(PdError) as info:
        model.normalize("cluster_a", raw_cluster(model={"path": MODEL_PATH, "family": "llama"}))
    assert "generic" in info.value.fix and "deepseek_v4_flash" in info.value.fix
