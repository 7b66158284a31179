"""plugin_utils.rules: each rule fails and passes, all violations come back at once.

The fixtures are built by hand from docs/design.md (normalized cluster, host records, topology),
so these tests do not depend on plugin_utils.model's normalisation.
"""

import copy
import json

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import connectors, model, ports, versions
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import rules

GIB = 1024 ** 3


# ---- factories (docs/design.md shapes) ----------------------------------------------------------

def make_engine(**over):
    engine = {
        "gpu_memory_utilization": 0.85, "max_num_seqs": 32, "max_num_batched_tokens": 32768,
        "max_model_len": 32768, "block_size": 32, "enable_prefix_caching": True,
        "prefix_cache_retention_interval": 4096, "disable_hybrid_kv_cache_manager": False,
        "max_num_partial_prefills": 1, "max_long_partial_prefills": 1, "long_prefill_token_threshold": 8192,
        "enforce_eager": False, "num_speculative_tokens": 0, "extra_args": [],
    }
    engine.update(over)
    return engine


def make_role(role, **over):
    base = {
        "role": role, "instances": 1, "dp": 2, "tp": 4,
        "port_base": 8100 if role == "prefill" else 8200,
        "kv_port": 30000 if role == "prefill" else 30100,
        "dp_rpc_port": 13389 if role == "prefill" else 13399,
        "mooncake": True,
        "offload_connector": "OffloadingConnector" if role == "prefill" else "RecomputeCPUOffloadConnector",
        "cpu_offload_bytes": 200 * GIB,
        "recompute_scheduler": role == "decode",
        "shm_size_bytes": None,
        # MTP as upstream runs it: P drafts 1 token eagerly; the article's D: 144 = 48 x (1 + 2)
        "engine": make_engine(enforce_eager=True, num_speculative_tokens=1) if role == "prefill" else make_engine(
            max_num_seqs=48, max_num_batched_tokens=144, enable_prefix_caching=False,
            prefix_cache_retention_interval=None, num_speculative_tokens=2),
        "env": {}, "privileged": False,
    }
    base.update(over)
    return base


#: published image tag per line (vllm-ascend release tags; main's scheduled build is nightly-main)
TAGS = {"0.23": "v0.23.0", "0.24": "v0.24.0rc1", "0.25": "v0.25.1rc1", "main": "nightly-main"}


def make_cluster(version="main"):
    """The article's cluster: P DP2xTP4 + OffloadingConnector 200GiB, D DP2xTP4 + Recompute 200GiB.

    On main: the only line whose OffloadingConnector starts with DeepSeek-V4-Flash.
    """
    line = version if version == "main" else ".".join(version.lstrip("v").split(".")[:2])
    return {
        "name": "cluster_a", "vllm_ascend_version": version,
        "image": f"quay.io/ascend/vllm-ascend:{TAGS.get(line, 'v' + version)}",
        "recipe": {"tokenizer_mode": "deepseek_v4", "tool_call_parser": "deepseek_v4",
                   "enable_auto_tool_choice": True, "reasoning_parser": "deepseek_v4",
                   "enable_expert_parallel": True, "quantization": "ascend", "speculative_method": "mtp",
                   "allocator_preload": None, "env": {}},
        "model": {"path": "/data/models/DeepSeek-V4-Flash", "served_name": "deepseek-v4-flash",
                  "family": "deepseek_v4_flash"},
        "workload": {"avg_prompt_tokens": 10240, "p99_prompt_tokens": 28672, "p99_output_tokens": 2048},
        "mooncake_connector": "MooncakeConnectorV1",
        "proxy": {"host": None, "port": 8000, "max_retries": 3, "retry_delay": 1},
        "roles": {"prefill": make_role("prefill"), "decode": make_role("decode")},
    }


def make_host(name, role, address, npus=8, ram=1024 * GIB, **over):
    host = {"name": name, "role": role, "address": address, "npus": npus, "hbm_per_npu_bytes": 64 * GIB,
            "ram_bytes": ram, "hccl_if": "eth0", "npu_first": 0}
    host.update(over)
    return host


def make_hosts(**over):
    return [make_host("a-p0", "prefill", over.get("p_address", "10.0.0.1"), npus=over.get("p_npus", 8),
                      ram=over.get("p_ram", 1024 * GIB)),
            make_host("a-d0", "decode", over.get("d_address", "10.0.0.2"), npus=over.get("d_npus", 8),
                      ram=over.get("d_ram", 1024 * GIB))]


def make_topo(cluster, hosts):
    """The real placement (model.topology): the rules are checked on what the deploy would build."""
    return model.topology(cluster, hosts)[0]


def make_specs(cluster, topo):
    """Minimal rank launch specs carrying the fields the rules read (argv, shm, pinned bytes)."""
    row = versions.version_row(cluster["vllm_ascend_version"])
    specs = []
    for inst in topo["instances"]:
        rcfg = cluster["roles"][inst["role"]]
        for rank in inst["ranks"]:
            host = topo["hosts"][rank["host"]]
            if rcfg["offload_connector"] == "RecomputeCPUOffloadConnector":
                value = rcfg["cpu_offload_bytes"] // host["npus"]
                pinned = value * rcfg["tp"]
            elif rcfg["offload_connector"] == "OffloadingConnector":
                value = pinned = rcfg["cpu_offload_bytes"] // (host["npus"] // rcfg["tp"])
            else:
                value, pinned = None, 0
            command = ["vllm", "serve", cluster["model"]["path"], "--port", str(rank["port"])]
            kv = connectors.kv_transfer_config(rcfg, cluster, inst, row, value)
            if kv:
                command += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
            auto_shm = max(16 * GIB, -(-pinned * 128 // (100 * GIB)) * GIB)
            specs.append({"name": rank["container"], "role": inst["role"], "instance": inst["index"],
                          "dp_rank": rank["dp_rank"], "host": rank["host"], "command": command,
                          "shm_size_bytes": rcfg["shm_size_bytes"] or auto_shm,
                          "pinned_offload_bytes": pinned})
    return specs


def check(cluster=None, hosts=None, topo=None, **kw):
    cluster = cluster or make_cluster()
    topo = topo or make_topo(cluster, hosts or make_hosts())
    return rules.check_cluster(cluster, topo, **kw)


def hits(vs, field, level=None):
    return [v for v in vs if v["field"] == field and (level is None or v["level"] == level)]


def with_role(role, **over):
    cluster = make_cluster()
    cluster["roles"][role].update(over)
    return cluster


def with_engine(role, **over):
    cluster = make_cluster()
    cluster["roles"][role]["engine"].update(over)
    return cluster


# ---- the baseline ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", versions.known_versions())
def test_article_cluster_is_clean_on_every_line(version):
    vs = check(make_cluster(version))
    if version == "main":
        assert vs == []
        return
    # v0.23 .. v0.26 ship vllm_ascend.kv_offload.npu, which cannot run DeepSeek-V4-Flash (issue 10 #2):
    # the article's P offload is the one thing refused there
    assert [(v["level"], v["where"], v["field"]) for v in vs] == [
        ("error", "cluster_a/prefill", "prefill.offload_connector")] + (
        [("warning", "cluster_a", "image")] if version == "0.26" else [])


def test_article_cluster_is_clean_with_specs():
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    assert rules.check_cluster(cluster, topo, make_specs(cluster, topo)) == []


def test_violation_shape():
    vs = check(with_engine("prefill", gpu_memory_utilization=0.96))
    assert vs == [{"level": "error", "where": "cluster_a/prefill", "field": "prefill.engine.gpu_memory_utilization",
                   "message": vs[0]["message"], "fix": "set gpu_memory_utilization: 0.85 (production)"}]
    assert vs[0]["message"].startswith("0.96 >= 0.95")


# ---- one failing and one passing case per rule --------------------------------------------------

def test_version_known():
    vs = check(make_cluster("0.22.1"))
    assert [v["level"] for v in hits(vs, "vllm_ascend_version")] == ["error"]
    assert "0.23, 0.24, 0.25, 0.26, main" in hits(vs, "vllm_ascend_version")[0]["fix"]
    assert hits(check(make_cluster("main")), "vllm_ascend_version") == []


def test_engine_types():
    vs = check(with_engine("prefill", gpu_memory_utilization="0.85", max_num_seqs=0))
    assert hits(vs, "prefill.engine.gpu_memory_utilization", "error")
    assert hits(vs, "prefill.engine.max_num_seqs", "error")
    cluster = make_cluster()
    cluster["workload"]["avg_prompt_tokens"] = "10k"
    assert hits(check(cluster), "workload.avg_prompt_tokens", "error")
    assert hits(check(), "prefill.engine.max_num_seqs") == []


def test_mooncake_connector_name():
    cluster = make_cluster()
    cluster["mooncake_connector"] = "MooncakeConnectorStoreV1"
    vs = hits(check(cluster), "mooncake_connector", "error")
    assert vs and "MooncakeConnectorV1, MooncakeHybridConnector" in vs[0]["fix"]
    cluster["mooncake_connector"] = "MooncakeHybridConnector"
    assert check(cluster) == []


def test_mooncake_both_sides():
    assert hits(check(with_role("decode", mooncake=False)), "decode.mooncake", "error")
    cluster = make_cluster()
    cluster["roles"]["prefill"]["mooncake"] = False
    cluster["roles"]["decode"]["mooncake"] = False
    assert hits(check(cluster), "decode.mooncake") == [] and hits(check(cluster), "prefill.mooncake") == []


def test_recompute_scheduler_only_on_decode():
    vs = hits(check(with_role("prefill", recompute_scheduler=True)), "prefill.recompute_scheduler", "error")
    assert vs and "decode" in vs[0]["message"]
    assert hits(check(), "prefill.recompute_scheduler") == []


def test_recompute_scheduler_needs_a_consumer_connector():
    cluster = with_role("decode", mooncake=False, offload_connector="none", cpu_offload_bytes=0)
    cluster["roles"]["prefill"]["mooncake"] = False
    assert hits(check(cluster), "decode.recompute_scheduler", "error")
    cluster["roles"]["decode"]["recompute_scheduler"] = False
    assert hits(check(cluster), "decode.recompute_scheduler") == []


def test_recompute_connector_only_on_decode():
    cluster = with_role("prefill", offload_connector="RecomputeCPUOffloadConnector", recompute_scheduler=False)
    assert hits(check(cluster), "prefill.offload_connector", "error")
    assert hits(check(), "prefill.offload_connector") == []


def test_offloading_connector_only_on_prefill():
    cluster = with_role("decode", offload_connector="OffloadingConnector", recompute_scheduler=False)
    assert hits(check(cluster), "decode.offload_connector", "error")
    assert hits(check(), "decode.offload_connector") == []


def test_offload_bytes_consistency():
    assert hits(check(with_role("prefill", cpu_offload_bytes=0)), "prefill.cpu_offload", "error")
    assert hits(check(with_role("prefill", offload_connector="none")), "prefill.cpu_offload", "warning")
    assert hits(check(with_role("decode", recompute_scheduler=False)), "decode.recompute_scheduler", "warning")
    assert hits(check(with_role("prefill", offload_connector="none", cpu_offload_bytes=0)), "prefill.cpu_offload") == []


@pytest.mark.parametrize("value, level", [
    (0, "error"), (-0.1, "error"), (1.2, "error"), (1.0, "error"), (0.95, "error"), (0.96, "error"),
    (0.94, "warning"), (0.90, "warning"),
    (0.89, None), (0.85, None), (0.80, None),
])
def test_gpu_memory_utilization(value, level):
    found = hits(check(with_engine("decode", gpu_memory_utilization=value)), "decode.engine.gpu_memory_utilization")
    assert [v["level"] for v in found] == ([level] if level else [])
    if level:
        assert found[0]["fix"] == "set gpu_memory_utilization: 0.85 (production)"


def test_batched_tokens_at_least_twice_the_average_prompt():
    found = hits(check(with_engine("prefill", max_num_batched_tokens=8192)), "prefill.engine.max_num_batched_tokens")
    assert [v["level"] for v in found] == ["warning"]
    assert "only 1 request running" in found[0]["message"]
    assert "32768" in found[0]["fix"]
    assert hits(check(with_engine("prefill", max_num_batched_tokens=20480)),
                "prefill.engine.max_num_batched_tokens") == []
    # decode keeps a small budget on purpose (144 in the article)
    assert hits(check(), "decode.engine.max_num_batched_tokens") == []


def test_batched_tokens_danger_zone_at_tp4():
    found = hits(check(with_engine("prefill", max_num_batched_tokens=65537)), "prefill.engine.max_num_batched_tokens")
    assert [v["level"] for v in found] == ["error"]
    # the article: "65536 是危险区" -- 65536 itself is the danger zone: at least a warning
    found = hits(check(with_engine("prefill", max_num_batched_tokens=65536)), "prefill.engine.max_num_batched_tokens")
    assert [v["level"] for v in found] == ["warning"]
    assert "danger zone" in found[0]["message"] and "32768" in found[0]["fix"]
    assert hits(check(with_engine("prefill", max_num_batched_tokens=49152)),
                "prefill.engine.max_num_batched_tokens") == []
    # at TP8 the article measured nothing: a warning, not an error
    cluster = with_engine("prefill", max_num_batched_tokens=98304)
    cluster["roles"]["prefill"]["tp"] = 8
    cluster["roles"]["prefill"]["dp"] = 1
    cluster["roles"]["decode"]["tp"] = 8
    cluster["roles"]["decode"]["dp"] = 1
    found = hits(check(cluster), "prefill.engine.max_num_batched_tokens")
    assert [v["level"] for v in found] == ["warning"]
    assert "not proven safe" in found[0]["message"]


@pytest.mark.parametrize("interval, level", [
    (4100, "error"), (-32, "error"), ("4096", "error"), (8192, "warning"), (0, "warning"),
    (4096, None), (None, None),
])
def test_retention_interval(interval, level):
    found = hits(check(with_engine("prefill", prefix_cache_retention_interval=interval)),
                 "prefill.engine.prefix_cache_retention_interval")
    assert [v["level"] for v in found] == ([level] if level else [])
    if level:
        assert "4096" in found[0]["fix"]


def test_retention_interval_follows_block_size():
    cluster = with_engine("prefill", block_size=128, prefix_cache_retention_interval=16384)
    cluster["roles"]["decode"]["engine"]["block_size"] = 128
    assert check(cluster) == []
    cluster["roles"]["prefill"]["engine"]["prefix_cache_retention_interval"] = 4096
    found = hits(check(cluster), "prefill.engine.prefix_cache_retention_interval", "warning")
    assert found and "16384" in found[0]["fix"]


def test_hybrid_kv_cache_manager_must_stay_on_v4():
    assert hits(check(with_engine("decode", disable_hybrid_kv_cache_manager=True)),
                "decode.engine.disable_hybrid_kv_cache_manager", "error")
    assert hits(check(with_engine("prefill", extra_args=["--disable-hybrid-kv-cache-manager"])),
                "prefill.engine.extra_args", "error")
    cluster = with_engine("decode", disable_hybrid_kv_cache_manager=True)
    cluster["model"]["family"] = "qwen3"
    assert hits(check(cluster), "decode.engine.disable_hybrid_kv_cache_manager") == []


def _tamper_spec(specs, role, mutate):
    out = copy.deepcopy(specs)
    for spec in out:
        if spec["role"] == role:
            i = spec["command"].index("--kv-transfer-config") + 1
            config = json.loads(spec["command"][i])
            mutate(config)
            spec["command"][i] = json.dumps(config)
    return out


def _moon(config):
    return config["kv_connector_extra_config"]["connectors"][0]


@pytest.mark.parametrize("mutate, field", [
    (lambda c: _moon(c)["kv_connector_extra_config"]["prefill"].update(dp_size=4),
     "decode.kv_transfer_config.MooncakeConnectorV1.prefill"),
    (lambda c: _moon(c)["kv_connector_extra_config"]["decode"].pop("tp_size"),
     "decode.kv_transfer_config.MooncakeConnectorV1.decode"),
    (lambda c: _moon(c).update(kv_role="kv_producer"), "decode.kv_transfer_config.MooncakeConnectorV1.kv_role"),
    (lambda c: _moon(c).update(kv_port="30000"), "decode.kv_transfer_config.MooncakeConnectorV1.kv_port"),
    (lambda c: c.update(engine_id="1"), "decode.kv_transfer_config.engine_id"),
    (lambda c: _moon(c).update(engine_id="1"), "decode.kv_transfer_config.connectors[0].engine_id"),
    (lambda c: c["kv_connector_extra_config"]["connectors"].pop(0), "decode.kv_transfer_config"),
    (lambda c: c["kv_connector_extra_config"]["connectors"][1].update(kv_role="kv_both"),
     "decode.kv_transfer_config.RecomputeCPUOffloadConnector.kv_role"),
])
def test_rendered_decode_config_is_checked_against_topology(mutate, field):
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    specs = _tamper_spec(make_specs(cluster, topo), "decode", mutate)
    found = hits(rules.check_cluster(cluster, topo, specs), field, "error")
    assert len(found) == 1  # two DP ranks on one host report once
    assert found[0]["where"] == "cluster_a/decode/instance 0@a-d0"


def test_rendered_prefill_offload_module_must_match_the_row():
    cluster = make_cluster("main")
    topo = make_topo(cluster, make_hosts())
    old = versions.version_row("0.25.1")["offloading_spec_module_path"]

    def mutate(c):
        c["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"]["spec_module_path"] = old

    specs = _tamper_spec(make_specs(cluster, topo), "prefill", mutate)
    found = hits(rules.check_cluster(cluster, topo, specs),
                 "prefill.kv_transfer_config.OffloadingConnector.spec_module_path")
    assert [v["level"] for v in found] == ["error"]


def test_rendered_mooncake_must_match_the_real_topology_without_specs():
    # the topology says decode runs DP4 x TP2 while the role (and thus the builders) say DP2 x TP4
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    for inst in topo["instances"]:
        if inst["role"] == "decode":
            inst.update(dp=4, tp=2)
    found = hits(rules.check_cluster(cluster, topo), "prefill.kv_transfer_config.MooncakeConnectorV1.decode", "error")
    assert found and "{'dp_size': 4, 'tp_size': 2}" in found[0]["message"]


def test_rendered_config_that_is_not_json_is_reported():
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    specs = make_specs(cluster, topo)
    specs[0]["command"][-1] = "{not json"
    assert hits(rules.check_cluster(cluster, topo, specs), "prefill.kv_transfer_config", "error")


def test_prefill_tp_at_least_decode_tp():
    cluster = with_role("prefill", dp=4, tp=2)
    found = hits(check(cluster), "prefill.tp", "error")
    assert found and "prefill tp 2 < decode tp 4" in found[0]["message"]
    cluster = with_role("decode", dp=4, tp=2)  # P TP4 -> D TP2 is fine
    assert check(cluster) == []


def test_block_sizes_divide_each_other():
    assert hits(check(with_engine("decode", block_size=48)), "decode.engine.block_size", "error")
    assert hits(check(with_engine("decode", block_size=128)), "decode.engine.block_size") == []


def test_a_fixed_engine_id_is_refused_naming_the_cache_and_its_source():
    """issue 20 #2: the article's own engine_id "1" on decode, as an older pd-deploy rendered it."""
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    specs = _tamper_spec(make_specs(cluster, topo), "decode", lambda c: c.update(engine_id="1"))
    found = hits(rules.check_cluster(cluster, topo, specs), "decode.kv_transfer_config.engine_id", "error")
    row = versions.version_row(cluster["vllm_ascend_version"])
    assert found and row["kv_peer_cache"]["sources"][0] in found[0]["message"], found
    assert "render no engine_id" in found[0]["fix"]
    assert [v for v in rules.check_cluster(cluster, topo, make_specs(cluster, topo)) if "engine_id" in v["field"]] == []


def test_kv_port_ranges_must_not_overlap_on_one_address():
    hosts = make_hosts(d_address="10.0.0.1")  # P and D hosts share an address
    vs = check(with_role("decode", kv_port=30004), hosts=hosts)
    found = hits(vs, "decode.kv_port", "error")
    assert found and "30004..30011 overlap prefill instance 0's 30000..30007" in found[0]["message"]
    assert hits(check(with_role("decode", kv_port=30008), hosts=hosts), "decode.kv_port") == []
    # different addresses may reuse the same ports
    assert hits(check(with_role("decode", kv_port=30000)), "decode.kv_port") == []


def test_ports_are_the_machines_whatever_addresses_its_hosts_have():
    """Two host entries of one machine (pd_machine) with two addresses share one port space: host
    networking binds every rank on the machine (issue 19 #2: per-machine rules)."""
    hosts = [make_host("m-p0", "prefill", "10.0.0.1", machine="m1"),
             make_host("m-d0", "decode", "10.0.0.2", npu_first=8, machine="m1")]
    found = hits(check(with_role("decode", kv_port=30004), hosts=hosts), "decode.kv_port", "error")
    assert found and "on m1" in found[0]["message"]
    found = hits(check(with_role("decode", port_base=8101, kv_port=30100), hosts=hosts), "decode.port_base", "error")
    assert found and "also used by pd-cluster_a-prefill0-dp1" in found[0]["message"]
    # each instance of the machine gets its own HCCL window
    topo = make_topo(make_cluster(), hosts)
    assert sorted({r["hccl_slot"] for r in topo["hosts"]["m-d0"]["ranks"]}) == [1]
    # two machines may reuse the same ports
    apart = [dict(h, machine=f"m{i}") for i, h in enumerate(hosts)]
    assert hits(check(with_role("decode", kv_port=30004), hosts=apart), "decode.kv_port") == []


def test_entries_that_share_an_address_share_its_ports_whatever_pd_machine_says():
    """One address is one network namespace: two entries on 127.0.0.1 named as two machines (the
    Molecule hosts) still clash on a port (molecule/reject's kv-port-overlap case: per-machine ports
    alone let decode's kv range overlap prefill's on the one address)."""
    hosts = [make_host("m-p0", "prefill", "127.0.0.1", machine="p0"),
             make_host("m-d0", "decode", "127.0.0.1", machine="d0")]
    found = hits(check(with_role("decode", kv_port=30004), hosts=hosts), "decode.kv_port", "error")
    assert found and "on p0" in found[0]["message"], found
    topo = make_topo(make_cluster(), hosts)
    assert sorted({r["hccl_slot"] for r in topo["hosts"]["m-d0"]["ranks"]}) == [1]


def test_port_spaces_join_entries_linked_by_machine_or_address():
    spaces = ports.port_spaces([("a", "m1", "10.0.0.1"), ("b", "m1", "10.0.0.2"), ("c", "m2", "10.0.0.2"),
                                ("d", "m3", "10.0.0.3"), ("e", None, "10.0.0.4")])
    assert spaces == {"a": "m1", "b": "m1", "c": "m1", "d": "m3", "e": "10.0.0.4"}


def test_kv_port_ranges_between_instances_of_a_role():
    cluster = with_role("prefill", instances=2, dp=1)  # two DP1 x TP4 instances on one host
    topo = make_topo(cluster, make_hosts())
    assert hits(rules.check_cluster(cluster, topo), "prefill.kv_port") == []
    topo["instances"][1]["kv_port"] = 30002
    assert hits(rules.check_cluster(cluster, topo), "prefill.kv_port", "error")


# Mooncake 0.3.11.post1 (every versions.yml row's image; vllm-ascend Dockerfile ARG MOONCAKE_TAG) draws
# each NPU's transport port from 20000 + id x 100 .. 20000 + (id + 1) x 100, both ends
# (Mooncake v0.3.10.post1+ ascend_direct_transport/utils.cpp). P DP2 x TP4 on 8 NPUs: ids 0..7 ->
# 20000..20800; kv ports must start strictly above, at 20801.
@pytest.mark.parametrize("npus, dp, kv_port, bad", [
    (8, 2, 20000, True), (8, 2, 20800, True), (8, 2, 20801, False), (8, 2, 19992, True),
    (8, 2, 30000, False), (8, 2, 20793, True),
    # 16 NPUs, P DP4 x TP4: ids 0..15 -> 20000..21600
    (16, 4, 21600, True), (16, 4, 21601, False),
])
def test_kv_port_strictly_above_mooncake_transport_window(npus, dp, kv_port, bad):
    cluster = with_role("prefill", kv_port=kv_port, dp=dp)
    found = hits(check(cluster, hosts=make_hosts(p_npus=npus)), "prefill.kv_port", "error")
    assert bool(found) is bad, found
    if bad:
        top = 20000 + npus * 100
        assert found[0]["fix"] == f"set prefill.kv_port >= {top + 1}"
        assert f"20000..{top}" in found[0]["message"] and "Mooncake 0.3.11.post1" in found[0]["message"]


def test_transport_window_uses_the_devices_of_the_mooncake_ranks():
    # P DP1 x TP4 on an 8-NPU host uses ids 0..3 only: 20000..20400, so 20401 is free for kv
    cluster = with_role("prefill", kv_port=20401, dp=1)
    assert hits(check(cluster), "prefill.kv_port", "error") == []
    # a host with pd_npu_first 4: ids 4..7 (physical from Mooncake 0.3.10.post1) -> 20400..20800
    cluster = with_role("prefill", kv_port=20700, dp=1)
    hosts = [make_host("a-p0", "prefill", "10.0.0.1", npu_first=4, npus=4), make_hosts()[1]]
    found = hits(check(cluster, hosts=hosts), "prefill.kv_port", "error")
    assert found and "20400..20800" in found[0]["message"]


def test_ascend_base_port_moves_the_window():
    cluster = with_role("prefill", kv_port=30000, env={"ASCEND_BASE_PORT": "29500"})
    found = hits(check(cluster), "prefill.kv_port", "error")
    assert found and found[0]["fix"] == "set prefill.kv_port >= 30301"  # 29500 + 8 x 100 + 1


def test_shm_holds_the_pinned_offload():
    # P: 200GiB over 2 engines on the host -> 100GiB pinned per container
    found = hits(check(with_role("prefill", shm_size_bytes=64 * GIB)), "prefill.shm_size", "error")
    assert found and "128GiB" in found[0]["fix"]
    assert hits(check(with_role("prefill", shm_size_bytes=100 * GIB)), "prefill.shm_size") == []
    # D: 200GiB / 8 NPUs x TP4 = 100GiB pinned per container
    assert hits(check(with_role("decode", shm_size_bytes=99 * GIB)), "decode.shm_size", "error")
    assert hits(check(with_role("decode", shm_size_bytes=256 * GIB)), "decode.shm_size") == []


def test_shm_checked_in_specs():
    cluster = make_cluster()
    topo = make_topo(cluster, make_hosts())
    specs = make_specs(cluster, topo)
    assert hits(rules.check_cluster(cluster, topo, specs), "decode.shm_size") == []
    specs[-1]["shm_size_bytes"] = 32 * GIB
    assert hits(rules.check_cluster(cluster, topo, specs), "decode.shm_size", "error")


def test_offload_that_does_not_split_is_reported():
    found = hits(check(with_role("decode", cpu_offload_bytes=200 * GIB + 3)), "decode.cpu_offload", "error")
    assert found and "does not divide" in found[0]["message"]


def test_host_ram_holds_offload_and_reserve():
    found = hits(check(hosts=make_hosts(p_ram=256 * GIB)), "prefill.cpu_offload", "error")
    assert found and found[0]["where"] == "cluster_a/prefill@a-p0"
    assert hits(check(hosts=make_hosts(p_ram=264 * GIB)), "prefill.cpu_offload") == []  # 200 + 64 reserve
    assert hits(check(hosts=make_hosts(p_ram=512 * GIB), ram_reserve_bytes=400 * GIB), "prefill.cpu_offload", "error")


def test_host_ram_uses_the_host_record_reserve():
    cluster = make_cluster()
    hosts = make_hosts(p_ram=300 * GIB)
    assert hits(check(cluster, hosts=hosts), "prefill.cpu_offload") == []
    hosts[0]["ram_reserve_bytes"] = 128 * GIB
    assert hits(check(cluster, hosts=hosts), "prefill.cpu_offload", "error")


def test_max_model_len_covers_p99():
    found = check(with_engine("decode", max_model_len=16384))
    assert [v["level"] for v in hits(found, "decode.engine.max_model_len")] == ["error"]
    assert "30720" in hits(found, "decode.engine.max_model_len")[0]["fix"]
    assert hits(check(with_engine("decode", max_model_len=30720)), "decode.engine.max_model_len") == []


@pytest.mark.parametrize("key", ["max_num_partial_prefills", "max_long_partial_prefills"])
def test_partial_prefills_refused_per_row(key):
    found = hits(check(with_engine("prefill", **{key: 2})), f"prefill.engine.{key}")
    assert [v["level"] for v in found] == ["error"]
    assert "Concurrent Partial Prefill is not supported" in found[0]["message"]
    assert hits(check(with_engine("prefill", **{key: 1})), f"prefill.engine.{key}") == []


def test_partial_prefills_reset_rows_warn(monkeypatch):
    real = versions.version_row

    def reset_row(version):
        return dict(real(version), partial_prefills_over_max="reset")

    monkeypatch.setattr(rules.versions, "version_row", reset_row)
    found = hits(check(with_engine("prefill", max_num_partial_prefills=2)), "prefill.engine.max_num_partial_prefills")
    assert [v["level"] for v in found] == ["warning"]
    assert "resets it to 1" in found[0]["message"]


def test_tp_must_divide_host_npus():
    cluster = with_role("prefill", tp=3, dp=2)
    cluster["roles"]["decode"]["tp"] = 3  # keep prefill tp >= decode tp out of the picture
    vs = check(cluster)
    found = hits(vs, "prefill.tp", "error")
    assert found and found[0]["where"] == "cluster_a/prefill@a-p0"
    assert hits(check(), "prefill.tp") == []


def test_ranks_must_fit_the_role_hosts():
    found = hits(check(with_role("decode", instances=2)), "decode.instances", "error")
    assert found and "need 16 NPUs" in found[0]["message"] and "have 8 usable" in found[0]["message"]
    hosts = make_hosts() + [make_host("a-d1", "decode", "10.0.0.3")]
    assert hits(check(with_role("decode", instances=2), hosts=hosts), "decode.instances") == []


def test_http_ports_unique_per_address():
    hosts = make_hosts(d_address="10.0.0.1")
    found = hits(check(with_role("decode", port_base=8101, kv_port=30100), hosts=hosts), "decode.port_base", "error")
    assert found and "also used by pd-cluster_a-prefill0-dp1" in found[0]["message"]
    assert hits(check(hosts=hosts), "decode.port_base") == []


def test_proxy_and_dp_rpc_ports_unique():
    cluster = make_cluster()
    cluster["proxy"]["port"] = 8100
    assert hits(check(cluster), "proxy.port", "error")
    cluster["proxy"].update(host="a-d0", port=8000)
    assert hits(check(cluster), "proxy.port") == []
    cluster = with_role("prefill", dp_rpc_port=30004)
    found = hits(check(cluster), "prefill.dp_rpc_port", "error")
    assert found and "kv ports" in found[0]["message"]


# ---- all at once, formatting, inputs, purity ---------------------------------------------------

def test_every_violation_at_once():
    cluster = make_cluster()
    cluster["roles"]["prefill"]["recompute_scheduler"] = True
    cluster["roles"]["prefill"]["engine"].update(gpu_memory_utilization=0.96, max_num_batched_tokens=8192,
                                                 prefix_cache_retention_interval=4100, max_num_partial_prefills=2)
    cluster["roles"]["decode"]["engine"].update(block_size=48, max_model_len=8192,
                                                disable_hybrid_kv_cache_manager=True)
    cluster["roles"]["decode"].update(kv_port=20500, shm_size_bytes=GIB)
    cluster["mooncake_connector"] = "NotMooncake"
    vs = check(cluster, hosts=make_hosts(p_ram=128 * GIB))
    fields = {v["field"] for v in vs}
    assert {
        "prefill.recompute_scheduler", "prefill.engine.gpu_memory_utilization",
        "prefill.engine.max_num_batched_tokens", "prefill.engine.prefix_cache_retention_interval",
        "prefill.engine.max_num_partial_prefills", "decode.engine.block_size", "decode.engine.max_model_len",
        "decode.engine.disable_hybrid_kv_cache_manager", "decode.kv_port", "decode.shm_size",
        "mooncake_connector", "prefill.cpu_offload",
    } <= fields
    assert rules.has_errors(vs)
    assert all(set(v) == {"level", "where", "field", "message", "fix"} for v in vs)
    assert all(v["level"] in ("error", "warning") and v["message"] and v["fix"] for v in vs)


def test_format_violation():
    v = {"level": "error", "where": "cluster_a/prefill", "field": "prefill.engine.gpu_memory_utilization",
         "message": "0.96 >= 0.95", "fix": "set 0.85 (production)"}
    assert rules.format_violation(v) == \
        "ERROR cluster_a/prefill: prefill.engine.gpu_memory_utilization: 0.96 >= 0.95 — set 0.85 (production)"
    assert rules.format_violation(dict(v, level="warning", fix="")).startswith("WARNING cluster_a/prefill: ")
    assert " — " not in rules.format_violation(dict(v, fix=None))
    with pytest.raises(PdError, match="pd_format_violation"):
        rules.format_violation("ERROR")
    with pytest.raises(PdError, match="missing key"):
        rules.format_violation({"level": "error"})


def test_has_errors():
    assert rules.has_errors([]) is False
    assert rules.has_errors([{"level": "warning"}]) is False
    assert rules.has_errors([{"level": "warning"}, {"level": "error"}]) is True
    with pytest.raises(PdError, match="pd_has_errors"):
        rules.has_errors(None)


@pytest.mark.parametrize("cluster, topo, field", [
    ([], {"instances": [], "hosts": {}}, "cluster"),
    ({"name": "x"}, {"instances": [], "hosts": {}}, "cluster"),
    ("cluster", None, "cluster"),
])
def test_wrong_input_shape_raises(cluster, topo, field):
    with pytest.raises(PdError) as err:
        rules.check_cluster(cluster, topo)
    assert err.value.where == "pd_check_cluster"
    assert err.value.field == field


def test_wrong_topology_or_specs_shape_raises():
    cluster = make_cluster()
    with pytest.raises(PdError, match="topo"):
        rules.check_cluster(cluster, [])
    with pytest.raises(PdError, match="topo"):
        rules.check_cluster(cluster, {"instances": {}})
    topo = make_topo(cluster, make_hosts())
    with pytest.raises(PdError, match="specs"):
        rules.check_cluster(cluster, topo, specs="x")
    with pytest.raises(PdError, match="ram_reserve_bytes"):
        rules.check_cluster(cluster, topo, ram_reserve_bytes="64GiB")
    broken = make_cluster()
    del broken["roles"]["decode"]["engine"]
    with pytest.raises(PdError, match="cluster.roles.decode"):
        rules.check_cluster(broken, topo)


def test_twice_equal_and_inputs_untouched():
    cluster = make_cluster()
    cluster["roles"]["prefill"]["engine"]["gpu_memory_utilization"] = 0.92
    cluster["roles"]["decode"]["kv_port"] = 20500
    topo = make_topo(cluster, make_hosts())
    specs = make_specs(cluster, topo)
    snapshot = copy.deepcopy((cluster, topo, specs))
    first = rules.check_cluster(cluster, topo, specs)
    first[0]["message"] = "tampered"
    first.append({"level": "error"})
    second = rules.check_cluster(cluster, topo, specs)
    assert second == rules.check_cluster(cluster, topo, specs)
    assert second != first and len(second) == 2
    assert (cluster, topo, specs) == snapshot
    assert rules.check_cluster(cluster, topo) == rules.check_cluster(cluster, topo)


def test_rules_are_documented_and_all_registered():
    names = [name for name in dir(rules) if name.startswith("rule_")]
    assert sorted(r.__name__ for r in rules.RULES) == sorted(names)
    assert all(r.__doc__ for r in rules.RULES)
    assert isinstance(rules.RULES, tuple)


# ---- issue 10 #2 / #3: upstream parity rules ------------------------------------------------------

@pytest.mark.parametrize("version", ["0.23.0", "v0.24.0rc1", "0.25.1rc1", "0.26"])
def test_offloading_connector_refused_where_its_spec_cannot_start(version):
    """v0.23 .. v0.26 ship vllm_ascend.kv_offload.npu (num_cpu_blocks, one block size, imports the
    paired vLLM lacks): refuse it naming cluster/role/field, the reason and both ways out."""
    vs = hits(check(make_cluster(version)), "prefill.offload_connector", "error")
    assert len(vs) == 1 and vs[0]["where"] == "cluster_a/prefill"
    assert "num_cpu_blocks" in vs[0]["message"] and "block size" in vs[0]["message"]
    assert "main" in vs[0]["fix"] and "offload_connector: none" in vs[0]["fix"]
    # without P offload the same line is clean of it
    cluster = make_cluster(version)
    cluster["roles"]["prefill"].update(offload_connector="none", cpu_offload_bytes=0)
    assert hits(check(cluster), "prefill.offload_connector") == []


def test_decode_batched_tokens_follow_seqs_times_one_plus_draft_tokens():
    # tutorial A2 D: 30 seqs, 1 MTP token -> 60; nightly D: 60 seqs, 3 tokens -> 240
    assert hits(check(with_engine("decode", max_num_seqs=30, num_speculative_tokens=1,
                                  max_num_batched_tokens=60)), "decode.engine.max_num_batched_tokens") == []
    assert hits(check(with_engine("decode", max_num_seqs=60, num_speculative_tokens=3,
                                  max_num_batched_tokens=240)), "decode.engine.max_num_batched_tokens") == []
    short = hits(check(with_engine("decode", max_num_seqs=60, num_speculative_tokens=3,
                                   max_num_batched_tokens=120)), "decode.engine.max_num_batched_tokens")
    assert [v["level"] for v in short] == ["error"] and "240" in short[0]["fix"]
    wide = hits(check(with_engine("decode", max_num_seqs=48, num_speculative_tokens=1,
                                  max_num_batched_tokens=144)), "decode.engine.max_num_batched_tokens")
    assert [v["level"] for v in wide] == ["warning"] and "96" in wide[0]["fix"]


def test_prefill_and_decode_agree_on_speculative_decoding():
    vs = hits(check(with_engine("prefill", num_speculative_tokens=0)), "prefill.engine.num_speculative_tokens")
    assert [v["level"] for v in vs] == ["error"] and "draft" in vs[0]["message"]
    cluster = make_cluster()
    cluster["recipe"]["speculative_method"] = None
    assert [v["level"] for v in hits(check(cluster), "recipe.speculative_method")] == ["error"]
    vs = hits(check(with_engine("prefill", num_speculative_tokens=3)), "prefill.engine.num_speculative_tokens")
    assert [v["level"] for v in vs] == ["warning"]
    # neither side speculative: fine (decode then batches max_num_seqs x 1)
    cluster = with_engine("prefill", num_speculative_tokens=0)
    cluster["roles"]["decode"]["engine"].update(num_speculative_tokens=0, max_num_batched_tokens=48)
    assert [v for v in check(cluster) if "speculative" in v["field"]] == []


def test_auto_tool_choice_needs_a_parser():
    cluster = make_cluster()
    cluster["recipe"]["tool_call_parser"] = None
    assert [v["level"] for v in hits(check(cluster), "recipe.enable_auto_tool_choice")] == ["error"]


@pytest.mark.parametrize("image, npus, level", [
    ("quay.io/ascend/vllm-ascend:v0.25.1", 8, "error"),           # no such tag: the line's is v0.25.1rc1
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1", 8, None),
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1", 16, "error"),       # A3 hosts need the -a3 image
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1-a3", 16, None),
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1-a3", 8, "error"),
    ("quay.io/ascend/vllm-ascend:v0.23.0", 8, "error"),           # another line's image
    ("registry.local:5000/vllm-ascend:custom", 8, None),          # own builds are not checked
])
def test_image_tag_matches_the_version_row(image, npus, level):
    cluster = make_cluster("0.25.1rc1")
    cluster["image"] = image
    cluster["roles"]["decode"]["dp"] = 4 if npus == 16 else 2
    vs = hits(check(cluster, hosts=make_hosts(p_npus=npus, d_npus=npus)), "image")
    assert [v["level"] for v in vs] == ([level] if level else [])
    if level:
        assert vs[0]["fix"].startswith("set image: quay.io/ascend/vllm-ascend:v0.25.1rc1")


def split_machine_hosts(address="10.0.0.1", ram=1024 * GIB):
    """One 16-NPU machine listed as two 8-NPU hosts (as inventories/local does): P on 0-7, D on 8-15."""
    return [make_host("m-p0", "prefill", address, npus=8, machine="m1", ram=ram),
            make_host("m-d0", "decode", address, npus=8, npu_first=8, machine="m1", ram=ram)]


@pytest.mark.parametrize("image, level", [
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1-a3", None),    # the machine has 16 NPUs: A3 image
    ("quay.io/ascend/vllm-ascend:v0.25.1rc1", "error"),    # the A2 image is built for another SoC
])
def test_image_variant_follows_the_machine_not_the_host(image, level):
    """Two 8-NPU host entries of one 16-NPU machine (pd_npu_first 0 and 8) run the -a3 image
    (vllm-ascend main: Dockerfile builds for ascend910b1, Dockerfile.a3 for ascend910_9391)."""
    cluster = make_cluster("0.25.1rc1")
    cluster["image"] = image
    vs = hits(check(cluster, hosts=split_machine_hosts()), "image")
    assert [v["level"] for v in vs] == ([level] if level else [])
    if level:
        assert vs[0]["fix"] == ("set image: quay.io/ascend/vllm-ascend:v0.25.1rc1-a3, or vllm_ascend_version "
                                "to the line of the tag you run")
        assert "m1" in vs[0]["message"]


def test_an_a3_chip_name_makes_the_machine_a3_even_when_the_cluster_sees_eight_npus():
    """A cluster holding only NPUs 0-7 of an A3 still runs the -a3 image when pd_npu_chip says Ascend910
    (npu-smi's Name on A3 dies; the prechecks compare pd_npu_chip with it)."""
    cluster = make_cluster("0.25.1rc1")
    hosts = [make_host("a-p0", "prefill", "10.0.0.1", npu_chip="Ascend910"),
             make_host("a-d0", "decode", "10.0.0.2", npu_chip="Ascend910")]
    found = hits(check(cluster, hosts=hosts), "image")
    assert [v["level"] for v in found] == ["error"] and "v0.25.1rc1-a3" in found[0]["fix"]
    cluster["image"] = "quay.io/ascend/vllm-ascend:v0.25.1rc1-a3"
    assert hits(check(cluster, hosts=hosts), "image") == []


def test_machine_npus_counts_the_machine_whatever_its_split():
    hosts = split_machine_hosts() + [make_host("x", "decode", "10.0.0.9")]
    assert rules.machine_npus(hosts) == {"m1": 16, "10.0.0.9": 8}
    # one entry on the upper half alone still proves a 16-NPU machine
    assert rules.machine_npus([make_host("y", "decode", "10.0.0.3", npu_first=8)]) == {"10.0.0.3": 16}


def test_main_images_are_nightly_main():
    assert hits(check(make_cluster("main")), "image") == []
    cluster = make_cluster("main")
    cluster["image"] = "quay.io/ascend/vllm-ascend:main"
    assert "nightly-main" in hits(check(cluster), "image")[0]["fix"]


def test_decode_graph_capture_cap():
    """vllm-ascend's default capture bound is min(max_num_seqs x (1 + N), 512) (platform.py)."""
    ok = with_engine("decode", cudagraph_mode="FULL_DECODE_ONLY", max_num_seqs=128, num_speculative_tokens=3,
                     max_num_batched_tokens=512)
    assert hits(check(ok), "decode.engine.max_num_seqs") == []
    over = with_engine("decode", cudagraph_mode="FULL_DECODE_ONLY", max_num_seqs=130, num_speculative_tokens=3,
                       max_num_batched_tokens=520)
    assert [v["level"] for v in hits(check(over), "decode.engine.max_num_seqs")] == ["warning"]
    eager = with_engine("decode", cudagraph_mode=None, max_num_seqs=130, num_speculative_tokens=3,
                        max_num_batched_tokens=520)
    assert hits(check(eager), "decode.engine.max_num_seqs") == []


# ---- weights per NPU and RAM guidance (issue 10 finding 5) --------------------------------------

def test_weights_that_do_not_fit_are_an_error_naming_role_host_and_fix():
    """bf16 DeepSeek-V4-Flash at DP8 x TP1: 256 experts over EP8 = 70.9 GB of experts per 64 GB NPU."""
    cluster = make_cluster()
    cluster["model"]["quantization"] = "bf16"
    cluster["roles"]["prefill"].update(tp=1, dp=8)
    found = hits(check(cluster), "model.quantization", "error")
    # prefill bf16 EP8 (70.9 GB of experts per NPU) and decode bf16 EP8 both fail on 64 GB
    assert [v["where"] for v in found] == ["cluster_a/prefill@a-p0", "cluster_a/decode@a-d0"]
    assert "bf16 weights need" in found[0]["message"] and "cannot start" in found[0]["message"]
    # w8a8 at EP8 x TP1 no longer fits P's 32768 batched tokens at 0.85: 60.96 GiB exposed x 0.85 =
    # 51.8 GiB < 47.1 GiB weights + 1.01 GiB reserve + 4 GiB activation; w4a8 (30.6 GiB) does
    assert "model.quantization: w4a8 fits" in found[0]["fix"]


def test_weights_that_fit_give_no_violation():
    assert hits(check(), "model.quantization") == []          # the article's w8a8 DP2 x TP4 on 64 GB


def test_a_32gb_npu_cannot_hold_w8a8_at_dp2_tp4():
    hosts = make_hosts()
    for host in hosts:
        host["hbm_per_npu_bytes"] = 32 * GIB                  # 910B4
    found = hits(check(hosts=hosts), "model.quantization", "error")
    assert len(found) == 2
    assert "32GiB x gpu_memory_utilization 0.85" in found[0]["message"]
    assert "pd_hbm_per_npu" in found[0]["fix"]


def test_ram_below_the_articles_guidance_is_a_warning():
    # 200 GiB of offload: the article advises >= 512 GB; 300 GiB holds 200 + 64 reserve (no error)
    found = hits(check(hosts=make_hosts(p_ram=300 * GIB)), "pd_host_ram")
    assert [(v["level"], v["where"]) for v in found] == [("warning", "cluster_a/prefill@a-p0")]
    assert "512GiB" in found[0]["message"]
    assert hits(check(hosts=make_hosts(p_ram=512 * GIB, d_ram=512 * GIB)), "pd_host_ram") == []


def test_ram_is_the_machines_when_it_is_split_into_hosts():
    """P and D entries of one 512 GiB machine pin 200 GiB each: 400 GiB + 64 GiB reserve fits, but the
    article's guidance for 400 GiB of offload is 712 GiB: a warning naming the machine. Two 512 GiB
    machines with 200 GiB each are fine."""
    hosts = split_machine_hosts(ram=512 * GIB)
    found = hits(check(hosts=hosts), "pd_host_ram")
    assert [v["level"] for v in found] == ["warning"]
    assert "machine m1 (m-p0, m-d0) RAM 512GiB" in found[0]["message"] and "400GiB" in found[0]["message"]
    apart = [dict(h, machine=f"m{i}") for i, h in enumerate(hosts)]
    assert hits(check(hosts=apart), "pd_host_ram") == []
    small = split_machine_hosts(ram=440 * GIB)     # 400 + 64 reserve > 440: the pinned offload cannot fit
    assert [v["level"] for v in check(hosts=small) if v["field"] == "decode/prefill.cpu_offload"] == ["error"]
