"""Render-only run of the real playbook on inventories/example (and inventories/local), once per
session, and check the written launch specs against DOMAIN.md and the inventory they came from."""

import json
import os
import re

import pytest
import yaml

from pd_render_helpers import REPO, assert_no_traceback, files_under, run_playbooks

from tests.fixtures.article import ARTICLE_D_RENDERED

pytestmark = pytest.mark.ansible

GIB = 1024 ** 3
MAIN_SPEC_MODULE = "vllm_ascend.distributed.kv_transfer.kv_pool.kv_offload.native.npu"
RELEASE_SPEC_MODULE = "vllm_ascend.kv_offload.npu"


@pytest.fixture(scope="session")
def rendered(tmp_path_factory, ansible_home):
    root = tmp_path_factory.mktemp("render")
    dirs = {inv: root / inv for inv in ("example", "local")}
    runs = run_playbooks({
        inv: ["playbooks/deploy_pd.yml", "-i", f"inventories/{inv}", "-e", "pd_render_only=true",
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
    # DOMAIN.md §3, D (article), plus cpu_bytes_to_use next to the per-rank value
    assert kv(specs["pd-cluster_a-decode0-dp0"]) == ARTICLE_D_RENDERED
    # both ranks of one instance carry the same connector config
    assert kv(specs["pd-cluster_a-decode0-dp1"]) == ARTICLE_D_RENDERED


def test_cluster_a_prefill_connector_is_mooncake_producer_then_offloading(specs):
    expected = {
        "kv_connector": "MultiConnector", "kv_role": "kv_producer",
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
        add = json.loads(arg(spec["command"], "--additional-config"))
        assert "recompute_scheduler_enable" not in add, name
        if spec["role"] == "decode":
            # both clusters are v0.25+ / main: the nested form
            assert add["scheduler_config"] == {"recompute_scheduler_enable": True}, name
        else:
            assert "scheduler_config" not in add, name


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
        config = kv(spec)
        kids = config["kv_connector_extra_config"].get("connectors", [config])
        assert kids[0]["kv_connector"] == "MooncakeHybridConnector", name
        assert kids[0]["kv_connector_extra_config"] == {"prefill": {"dp_size": 2, "tp_size": 4},
                                                        "decode": {"dp_size": 4, "tp_size": 4}}
    # v0.25.1rc1: the release-line OffloadingConnector cannot run V4-Flash, so P has no offload child
    # (issue 10 #2): the prefill config is the Mooncake producer alone
    pre = kv(specs["pd-cluster_b-prefill0-dp0"])
    assert pre["kv_connector"] == "MooncakeHybridConnector" and pre["kv_role"] == "kv_producer"
    assert RELEASE_SPEC_MODULE not in json.dumps(pre)


def test_example_images_are_published_tags(specs):
    """Issue 10 #3: there is no v0.25.1 image; main's scheduled build is nightly-main."""
    for name, spec in specs.items():
        want = {"cluster_a": "quay.io/ascend/vllm-ascend:nightly-main",
                "cluster_b": "quay.io/ascend/vllm-ascend:v0.25.1rc1"}[spec["cluster"]]
        assert spec["image"] == want, name


def test_example_runs_the_v4_recipe(specs):
    """Issue 10 #3: MTP (P 1 token eager, D graph mode), expert parallel, V4 tokenizer and parsers."""
    for name, spec in specs.items():
        if spec["kind"] != "engine":
            continue
        cmd = spec["command"]
        for flag, value in (("--tokenizer-mode", "deepseek_v4"), ("--tool-call-parser", "deepseek_v4"),
                            ("--reasoning-parser", "deepseek_v4"), ("--quantization", "ascend")):
            assert arg(cmd, flag) == value, name
        assert "--enable-expert-parallel" in cmd and "--enable-auto-tool-choice" in cmd, name
        spec_cfg = json.loads(arg(cmd, "--speculative-config"))
        assert spec_cfg["method"] == "mtp" and spec_cfg["enforce_eager"] is True, name
        if spec["role"] == "prefill":
            assert spec_cfg["num_speculative_tokens"] == 1 and "--enforce-eager" in cmd, name
            assert "--compilation-config" not in cmd, name
        else:
            assert json.loads(arg(cmd, "--compilation-config")) == {"cudagraph_mode": "FULL_DECODE_ONLY"}, name
            assert "--enforce-eager" not in cmd, name
            seqs = int(arg(cmd, "--max-num-seqs"))
            assert int(arg(cmd, "--max-num-batched-tokens")) == seqs * (1 + spec_cfg["num_speculative_tokens"])
        assert "VLLM_RPC_TIMEOUT" not in spec["env"], name
        assert spec["env"]["HCCL_OP_EXPANSION_MODE"] == "AIV", name
        assert spec["env"]["LD_PRELOAD"] == "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2", name
    # the article's D: 144 batched tokens = 48 x (1 + 2)
    assert arg(specs["pd-cluster_a-decode0-dp0"]["command"], "--max-num-batched-tokens") == "144"


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
        assert "engine_id" not in spec and "engine_id" not in kv(spec)
        # rank r is slot r % 2 of its host: devices 4*(r%2) .. 4*(r%2)+3
        devices = list(range(4 * (r % 2), 4 * (r % 2) + 4))
        assert spec["env"]["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, devices))
        # the container mounts all 8 NPUs of its host under their own names: numbering inside is
        # the host's, so every id above exists there and names the rank's own NPUs
        davinci = sorted(int(m.group(1)) for d in spec["devices"] if (m := re.match(r"/dev/davinci(\d+):", d)))
        assert davinci == list(range(8))
        assert [davinci[v] for v in devices] == devices
        assert spec["env"]["HCCL_IF_IP"] == inventory_address(spec["host"])


def test_cluster_b_decode_offload_follows_its_256gib_per_instance(specs):
    # one DP4 x TP4 instance over two 8-NPU hosts: 256GiB over its 16 NPUs, 128GiB pinned per host
    spec = specs["pd-cluster_b-decode0-dp2"]
    per_rank = kv(spec)["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"][
        "cpu_bytes_to_use_per_rank"]
    assert per_rank == 256 * GIB // 16
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


def test_capacity_summary_is_an_estimate_from_the_weights_per_npu(rendered):
    """cluster_a's prefill (DP2 x TP4, w8a8, expert parallel, 32768 batched tokens), by hand.

    Weights per NPU: 256 routed experts over EP8 = 32 per NPU, 44 MoE layers (43 + MTP) x 3 x
    4096 x 2048 params x 1 byte (int8) x 32/256; dense ~(291.05e9 - experts) params x 2 bytes / TP4.
    Reserve: 1.01GiB (non-torch + graph memory of vllm-ascend issue 13439's A2 log) + 32768 x 128KiB
    = 5.01GiB. KV per NPU = (64GiB - the 3.04GiB a 910B does not expose: 60.96GiB, same log) x 0.85 -
    weights - reserve; the article's "512 GB x 0.85 x 0.6 = 261 GB per host" assumed weights that fit
    in the other 40%.
    """
    _, build = rendered["example"]
    experts = 44 * 256 * 3 * 4096 * 2048
    weights = -(-experts * 8 * 32 // (8 * 256)) + -(-(291_050_000_000 - experts) * 16 // (8 * 4))
    reserve = round(1.01 * 1024 ** 3) + 32768 * 128 * 1024
    per_npu = int((64 * 1024 ** 3 - round(3.04 * 1024 ** 3)) * 0.85) - weights - reserve
    text = (build / "render" / "cluster_a" / "capacity.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in text.splitlines() if line.startswith("| ")}
    def gib(row):  # the report writes sizes as to_human does: two decimals, trailing zeros dropped
        assert row.endswith("GiB"), row
        return float(row[:-3])
    assert gib(rows["KV budget per NPU (estimate)"]) == round(per_npu / 1024 ** 3, 2)
    assert gib(rows["KV budget per DP group (TP NPUs)"]) == round(per_npu * 4 / 1024 ** 3, 2)
    assert gib(rows["KV budget per instance (DP groups)"]) == round(per_npu * 8 / 1024 ** 3, 2)
    assert gib(rows["KV budget per host (the role's NPUs on it)"]) == round(per_npu * 8 / 1024 ** 3, 2)
    assert per_npu * 8 < 0.5 * 8 * 64 * 1024 ** 3 * 0.85 * 0.6, "far below the article's 0.6 share"
    # both limits are per DP group: 32768 // 10240 = 3 prompts per group, 6 per DP2 instance
    assert rows["expected P concurrency per DP group / per instance"] == "3 / 6"
    assert rows["max-num-batched-tokens per DP group"] == "32768"
    for cluster in ("cluster_a", "cluster_b"):
        text = (build / "render" / cluster / "capacity.md").read_text()
        assert text.startswith(f"## {cluster}")
        assert "ESTIMATE, not measured" in text and "playbooks/baseline.yml" in text
        data = json.loads((build / "render" / cluster / "capacity.json").read_text())
        assert data["cluster"] == cluster
        assert data["capacity"]["prefill"]["weights_fit"] is True
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
    # one 16-NPU machine split into two 8-NPU hosts: an A3, whose image is the -a3 variant (issue 19 #2)
    assert {s["image"] for s in all_specs if s["role"] in ("prefill", "decode")} == {
        "quay.io/ascend/vllm-ascend:nightly-main-a3"}
