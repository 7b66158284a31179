"""Render-only run of the real playbook on inventories/example (and inventories/local), once per
session, and check the written launch specs against DOMAIN.md and the inventory they came from."""

import json
import os
import re

import pytest
import yaml

from pd_render_helpers import REPO, assert_no_traceback, files_under, run_playbooks

from tests.fixtures.article import ARTICLE_D

pytestmark = pytest.mark.ansible

GIB = 1024 ** 3
MAIN_SPEC_MODULE = "vllm_ascend.distributed.kv_transfer.kv_pool.kv_offload.native.npu"
RELEASE_SPEC_MODULE = "vllm_ascend.kv_offload.npu"


@pytest.fixture(scope="session")
def rendered(tmp_path_factory, ansible_home):
    root = tmp_path_factory.mktemp("render")
    dirs = {inv: root / inv for inv in ("example", "local")}
    runs = run_playbooks({
        inv: ["playbooks/deploy-pd.yml", "-i", f"inventories/{inv}", "-e", "pd_render_only=true",
              "-e", f"pd_plan_build_dir={path}"]
        for inv, path in dirs.items()}, ansible_home)
    return {inv: (runs[inv], dirs[inv]) for inv in dirs}


def load_specs(build):
    """{host: {container name: spec}} from <build>/render/<host>/*.json (cluster dirs skipped)."""
    out = {}
    render = build / "render"
    for host in sorted(os.listdir(render)):
        files = sorted(f for f in os.listdir(render / host) if f.startswith("pd-") and f.endswith(".json"))
        if files:
            out[host] = {f[:-5]: json.loads((render / host / f).read_text()) for f in files}
    return out


@pytest.fixture(scope="session")
def example(rendered):
    run, build = rendered["example"]
    assert run.rc == 0, str(run)
    return load_specs(build)


@pytest.fixture(scope="session")
def specs(example):
    """{container name: spec} over every host."""
    return {name: spec for host in example.values() for name, spec in host.items()}


def arg(command, flag):
    assert command.count(flag) == 1, f"{flag} x{command.count(flag)} in {command}"
    return command[command.index(flag) + 1]


def kv(spec):
    return json.loads(arg(spec["command"], "--kv-transfer-config"))


def inventory_address(host):
    with open(os.path.join(REPO, "inventories", "example", "host_vars", f"{host}.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)["ansible_host"]


# ---- the run itself -----------------------------------------------------------------------------

@pytest.mark.parametrize("inv", ["example", "local"])
def test_render_only_run_succeeds_without_traceback(rendered, inv):
    run, _ = rendered[inv]
    assert run.rc == 0, str(run)
    assert_no_traceback(run)
    assert "failed=0" in run.output and "unreachable=0" in run.output


def test_one_file_per_rank_and_proxy_on_its_host(example):
    assert {h: sorted(s) for h, s in example.items()} == {
        "a-p0": ["pd-cluster_a-prefill0-dp0", "pd-cluster_a-prefill0-dp1", "pd-cluster_a-proxy"],
        "a-d0": ["pd-cluster_a-decode0-dp0", "pd-cluster_a-decode0-dp1"],
        "b-p0": ["pd-cluster_b-prefill0-dp0", "pd-cluster_b-prefill0-dp1", "pd-cluster_b-proxy"],
        "b-d0": ["pd-cluster_b-decode0-dp0", "pd-cluster_b-decode0-dp1"],
        "b-d1": ["pd-cluster_b-decode0-dp2", "pd-cluster_b-decode0-dp3"],
    }
    for host, by_name in example.items():
        assert all(s["host"] == host for s in by_name.values())


# ---- cluster_a: the article ---------------------------------------------------------------------

def test_cluster_a_decode_connector_is_the_articles(specs):
    # DOMAIN.md §3, D (article), as the article prints it
    assert kv(specs["pd-cluster_a-decode0-dp0"]) == ARTICLE_D
    # both ranks of one instance carry the same connector config
    assert kv(specs["pd-cluster_a-decode0-dp1"]) == ARTICLE_D


def test_cluster_a_prefill_connector_is_mooncake_producer_then_offloading(specs):
    expected = {
        "kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "0",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "30000",
             "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 4},
                                           "decode": {"dp_size": 2, "tp_size": 4}}},
            # 200GiB for the host split over its two DP engines; vllm_ascend_version: main
            {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"cpu_bytes_to_use": 200 * GIB // 2, "blocks_per_chunk": 8,
                                           "spec_name": "NPUOffloadingSpec",
                                           "spec_module_path": MAIN_SPEC_MODULE}}]}}
    for r in (0, 1):
        assert kv(specs[f"pd-cluster_a-prefill0-dp{r}"]) == expected


def test_cluster_a_shm_is_the_articles_256gib(specs):
    for name, spec in specs.items():
        if spec["cluster"] == "cluster_a" and spec["kind"] == "engine":
            assert spec["shm_size_bytes"] == 274877906944 == 256 * GIB, name
            assert spec["shm_size_bytes"] >= spec["pinned_offload_bytes"]


def test_additional_config_only_in_decode_argv(specs):
    for name, spec in specs.items():
        if spec["kind"] != "engine":
            continue
        if spec["role"] == "decode":
            # both clusters are v0.25+ / main: the nested form
            assert json.loads(arg(spec["command"], "--additional-config")) == {
                "scheduler_config": {"recompute_scheduler_enable": True}}, name
        else:
            assert "--additional-config" not in spec["command"], name


def test_prefill_keeps_prefix_caching_and_the_hybrid_manager(specs):
    for name, spec in specs.items():
        if spec["kind"] == "engine":
            assert "--no-disable-hybrid-kv-cache-manager" in spec["command"], name
            want = "--enable-prefix-caching" if spec["role"] == "prefill" else "--no-enable-prefix-caching"
            assert want in spec["command"], name
    assert specs["pd-cluster_a-prefill0-dp0"]["env"]["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "4096"


# ---- cluster_b: the vllm-ascend V4 guide --------------------------------------------------------

def test_cluster_b_uses_the_hybrid_mooncake_connector(specs):
    for name, spec in specs.items():
        if spec["cluster"] != "cluster_b" or spec["kind"] != "engine":
            continue
        kids = kv(spec)["kv_connector_extra_config"]["connectors"]
        assert kids[0]["kv_connector"] == "MooncakeHybridConnector", name
        assert kids[0]["kv_connector_extra_config"] == {"prefill": {"dp_size": 2, "tp_size": 4},
                                                        "decode": {"dp_size": 4, "tp_size": 4}}
    # vllm_ascend_version 0.25.1: the release-line module path
    offload = kv(specs["pd-cluster_b-prefill0-dp0"])["kv_connector_extra_config"]["connectors"][1]
    assert offload["kv_connector_extra_config"]["spec_module_path"] == RELEASE_SPEC_MODULE


def test_cluster_b_block_128_with_retention_16384(specs):
    for name, spec in specs.items():
        if spec["cluster"] == "cluster_b" and spec["kind"] == "engine":
            assert arg(spec["command"], "--block-size") == "128", name
            if spec["role"] == "prefill":
                assert spec["env"]["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "16384"


def test_cluster_b_decode_instance_spans_two_hosts(specs):
    ranks = [specs[f"pd-cluster_b-decode0-dp{r}"] for r in range(4)]
    assert [s["host"] for s in ranks] == ["b-d0", "b-d0", "b-d1", "b-d1"]
    master = inventory_address("b-d0")
    for r, spec in enumerate(ranks):
        cmd = spec["command"]
        assert arg(cmd, "--data-parallel-rank") == str(r)
        assert arg(cmd, "--data-parallel-size") == "4"
        assert arg(cmd, "--tensor-parallel-size") == "4"
        assert arg(cmd, "--data-parallel-address") == master
        assert spec["engine_id"] == "1"
        # rank r is slot r % 2 of its host: devices 4*(r%2) .. 4*(r%2)+3
        devices = list(range(4 * (r % 2), 4 * (r % 2) + 4))
        assert spec["env"]["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, devices))
        davinci = sorted(int(m.group(1)) for d in spec["devices"] if (m := re.match(r"/dev/davinci(\d+):", d)))
        assert davinci == devices
        assert spec["env"]["HCCL_IF_IP"] == inventory_address(spec["host"])


def test_cluster_b_decode_offload_follows_its_128gib(specs):
    spec = specs["pd-cluster_b-decode0-dp2"]
    per_rank = kv(spec)["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"][
        "cpu_bytes_to_use_per_rank"]
    assert per_rank == 128 * GIB // 8
    assert spec["pinned_offload_bytes"] == per_rank * 4
    # shm left to auto: pinned x 1.28 rounded up to whole GiB
    assert spec["shm_size_bytes"] == -(-spec["pinned_offload_bytes"] * 128 // (100 * GIB)) * GIB


def test_proxies_list_every_rank_of_their_cluster(specs):
    for cluster, p_n, d_n in (("cluster_a", 2, 2), ("cluster_b", 2, 4)):
        cmd = specs[f"pd-{cluster}-proxy"]["command"]

        def values(flag):
            start = cmd.index(flag) + 1
            end = next((i for i in range(start, len(cmd)) if cmd[i].startswith("--")), len(cmd))
            return cmd[start:end]

        ranks = {role: sorted((s for s in specs.values() if s["cluster"] == cluster and s.get("role") == role),
                              key=lambda s: s["dp_rank"]) for role in ("prefill", "decode")}
        assert len(ranks["prefill"]) == p_n and len(ranks["decode"]) == d_n
        for role, flag in (("prefill", "prefiller"), ("decode", "decoder")):
            assert values(f"--{flag}-hosts") == [inventory_address(s["host"]) for s in ranks[role]]
            assert values(f"--{flag}-ports") == [str(s["ports"]["http"]) for s in ranks[role]]


# ---- fleet-wide ---------------------------------------------------------------------------------

def test_every_address_port_pair_is_unique(specs):
    claims = []
    for spec in specs.values():
        address = inventory_address(spec["host"])
        claims.append((address, spec["ports"]["http"]))
        if spec.get("dp_rank") == 0 and "dp_rpc" in spec["ports"]:
            claims.append((address, spec["ports"]["dp_rpc"]))
    assert len(claims) == len(set(claims)), sorted(claims)
    # kv ranges of different instances on one address do not overlap each other or those ports
    ranges = {}
    for spec in specs.values():
        if "kv" in spec["ports"]:
            ranges[(inventory_address(spec["host"]), spec["cluster"], spec["role"], spec["instance"])] = \
                tuple(spec["ports"]["kv"])
    for (addr, *who), (lo, hi) in ranges.items():
        for (o_addr, *o_who), (o_lo, o_hi) in ranges.items():
            if addr == o_addr and who != o_who:
                assert hi <= o_lo or o_hi <= lo
        assert not any(a == addr and lo <= p < hi for a, p in claims)


def test_capacity_summary_per_cluster_mentions_the_kv_budget(rendered):
    _, build = rendered["example"]
    # 8 NPUs x 64GiB x gpu_memory_utilization 0.85 x kv_cache_share 0.6 (DOMAIN.md §5: ~261 GB)
    budget_gib = 8 * 64 * 0.85 * 0.6
    for cluster in ("cluster_a", "cluster_b"):
        text = (build / "render" / cluster / "capacity.md").read_text()
        assert text.startswith(f"## {cluster}")
        row = next(line for line in text.splitlines() if line.startswith("| KV budget per host"))
        assert f"{budget_gib:.2f}GiB" in row
        assert "KV budget per DP group" in text
        data = json.loads((build / "render" / cluster / "capacity.json").read_text())
        assert data["cluster"] == cluster
    plan = json.loads((build / "plan.json").read_text())
    assert plan["ok"] is True


# ---- local inventory ----------------------------------------------------------------------------

def test_local_inventory_renders_both_roles_on_one_address(rendered):
    run, build = rendered["local"]
    assert run.rc == 0, str(run)
    local = load_specs(build)
    assert sorted(local) == ["local-d0", "local-p0"]
    all_specs = [s for host in local.values() for s in host.values()]
    assert {s["role"] for s in all_specs} == {"prefill", "decode", "proxy"}
    # both hosts are 127.0.0.1: every listening port must differ
    ports = [s["ports"]["http"] for s in all_specs]
    ports += [s["ports"]["dp_rpc"] for s in all_specs if s.get("dp_rank") == 0 and "dp_rpc" in s["ports"]]
    assert len(ports) == len(set(ports))
    assert "capacity.md" in files_under(build / "render" / "local")
