"""plugin_utils.connectors: the article's JSON, per-version keys, validation, purity."""

import copy
import json

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import connectors, versions
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.article import ARTICLE_D, ARTICLE_D_RENDERED

GIB = 1024 ** 3


def article_p_offload(spec_module_path):
    """DOMAIN.md §3, P (article) OffloadingConnector child, with the per-version module."""
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 214748364800, "blocks_per_chunk": 8,
                                          "spec_name": "NPUOffloadingSpec",
                                          "spec_module_path": spec_module_path}}


def role(name, **over):
    base = {"role": name, "instances": 1, "dp": 2, "tp": 4, "mooncake": True,
            "offload_connector": "none", "recompute_scheduler": False}
    base.update(over)
    return base


def cluster(**over):
    base = {"name": "cluster_a", "mooncake_connector": "MooncakeConnectorV1",
            "roles": {"prefill": role("prefill", offload_connector="OffloadingConnector"),
                      "decode": role("decode", offload_connector="RecomputeCPUOffloadConnector",
                                     recompute_scheduler=True)}}
    base.update(over)
    return base


def instance(name, kv_port):
    return {"role": name, "index": 0, "dp": 2, "tp": 4, "kv_port": kv_port}


def article_d():
    c = cluster()
    return connectors.kv_transfer_config(c["roles"]["decode"], c, instance("decode", 30100),
                                         versions.version_row("0.25.1"), 26843545600)


def test_article_d_json_reproduced():
    result = article_d()
    # the article's connector plus cpu_bytes_to_use = per rank x TP next to the per-rank value
    assert result == ARTICLE_D_RENDERED
    # same content and the article's key order once serialised compactly
    assert json.dumps(result, separators=(",", ":")) == json.dumps(ARTICLE_D_RENDERED, separators=(",", ":"))


def test_recompute_child_renders_the_server_wide_bytes_so_decode_does_not_warn():
    """Issue 10 #3: with only cpu_bytes_to_use_per_rank the connector compares it with its 8 GiB
    default / world size and logs a mismatch warning at every start."""
    child = connectors.recompute_child(26843545600, tp=4)
    extra = child["kv_connector_extra_config"]
    assert list(extra) == ["cpu_bytes_to_use", "cpu_bytes_to_use_per_rank"]
    # the connector's per-rank quotient (cpu_bytes_to_use // world_size) equals the per-rank value
    assert extra["cpu_bytes_to_use"] // 4 == extra["cpu_bytes_to_use_per_rank"] == 25 * 1024 ** 3


@pytest.mark.parametrize("version, module", [
    ("0.23.0", "vllm_ascend.kv_offload.npu"),
    ("0.25.1", "vllm_ascend.kv_offload.npu"),
    ("v0.25.1rc1", "vllm_ascend.kv_offload.npu"),
    ("0.26.0", "vllm_ascend.kv_offload.npu"),
    ("main", "vllm_ascend.distributed.kv_transfer.kv_pool.kv_offload.native.npu"),
])
def test_article_p_json_per_version(version, module):
    c = cluster()
    result = connectors.kv_transfer_config(c["roles"]["prefill"], c, instance("prefill", 30000),
                                           versions.version_row(version), 200 * GIB)
    assert result == {
        "kv_connector": "MultiConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "30000",
             "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 4},
                                           "decode": {"dp_size": 2, "tp_size": 4}}},
            article_p_offload(module)]}}


def test_offloading_child_matches_article_block():
    row = versions.version_row("main")
    assert connectors.offloading_child(214748364800, row) == article_p_offload(row["offloading_spec_module_path"])
    assert connectors.offloading_child(GIB, row, blocks_per_chunk=16)["kv_connector_extra_config"][
        "blocks_per_chunk"] == 16


def test_mooncake_child_shape():
    child = connectors.mooncake_child("prefill", "MooncakeHybridConnector", 30000,
                                      {"dp": 4, "tp": 4}, {"dp_size": 16, "tp_size": 1})
    assert child == {"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_producer", "kv_port": "30000",
                     "kv_connector_extra_config": {"prefill": {"dp_size": 4, "tp_size": 4},
                                                   "decode": {"dp_size": 16, "tp_size": 1}}}
    assert connectors.mooncake_child("decode", "MooncakeConnectorV1", 30100, {"dp": 2, "tp": 4},
                                     {"dp": 2, "tp": 4})["kv_role"] == "kv_consumer"


def test_recompute_child_shape():
    assert connectors.recompute_child(26843545600) == ARTICLE_D["kv_connector_extra_config"]["connectors"][1]


def test_mooncake_name_is_a_choice():
    c = cluster(mooncake_connector="MooncakeHybridConnector")
    result = connectors.kv_transfer_config(c["roles"]["decode"], c, instance("decode", 30100),
                                           versions.version_row("main"), 26843545600)
    assert result["kv_connector_extra_config"]["connectors"][0]["kv_connector"] == "MooncakeHybridConnector"


def test_single_child_is_returned_as_is():
    c = cluster()
    c["roles"]["prefill"]["offload_connector"] = "none"
    only_moon = connectors.kv_transfer_config(c["roles"]["prefill"], c, instance("prefill", 30000),
                                              versions.version_row("0.25.1"), None)
    assert only_moon == {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "30000",
                         "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 4},
                                                       "decode": {"dp_size": 2, "tp_size": 4}}}
    c = cluster()
    c["roles"]["prefill"]["mooncake"] = False
    only_offload = connectors.kv_transfer_config(c["roles"]["prefill"], c, instance("prefill", 30000),
                                                 versions.version_row("0.23.0"), 100 * GIB)
    assert only_offload["kv_connector"] == "OffloadingConnector"
    assert only_offload["kv_role"] == "kv_both"
    assert "engine_id" not in only_offload


def test_no_connector_gives_none():
    c = cluster()
    c["roles"]["decode"].update(mooncake=False, offload_connector="none")
    assert connectors.kv_transfer_config(c["roles"]["decode"], c, instance("decode", 30100),
                                         versions.version_row("0.25.1"), None) is None


@pytest.mark.parametrize("version, expected", [
    ("0.23.0", {"recompute_scheduler_enable": True}),
    ("v0.24.0rc1", {"recompute_scheduler_enable": True}),
    ("v0.25.1rc1", {"scheduler_config": {"recompute_scheduler_enable": True}}),
    ("0.25.1", {"scheduler_config": {"recompute_scheduler_enable": True}}),
    ("0.26.0", {"scheduler_config": {"recompute_scheduler_enable": True}}),
    ("main", {"scheduler_config": {"recompute_scheduler_enable": True}}),
])
def test_additional_config_placement_per_version(version, expected):
    assert connectors.additional_config(role("decode", recompute_scheduler=True),
                                        versions.version_row(version)) == expected


def test_additional_config_none_without_recompute():
    assert connectors.additional_config(role("decode"), versions.version_row("0.25.1")) is None


# ---- validation -------------------------------------------------------------------------------

ROW = versions.version_row("0.25.1")


@pytest.mark.parametrize("args, field", [
    (("middle", "MooncakeConnectorV1", 30000, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "role_name"),
    (("prefill", "", 30000, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "connector_name"),
    (("prefill", None, 30000, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "connector_name"),
    (("prefill", "MooncakeConnectorV1", "30000", {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "kv_port"),
    (("prefill", "MooncakeConnectorV1", 0, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "kv_port"),
    (("prefill", "MooncakeConnectorV1", 70000, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "kv_port"),
    (("prefill", "MooncakeConnectorV1", True, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 4}), "kv_port"),
    (("prefill", "MooncakeConnectorV1", 30000, [2, 4], {"dp": 2, "tp": 4}), "prefill_topo"),
    (("prefill", "MooncakeConnectorV1", 30000, {"dp": 0, "tp": 4}, {"dp": 2, "tp": 4}), "prefill_topo.dp"),
    (("prefill", "MooncakeConnectorV1", 30000, {"dp": 2}, {"dp": 2, "tp": 4}), "prefill_topo.tp"),
    (("prefill", "MooncakeConnectorV1", 30000, {"dp": 2, "tp": 4}, {"dp": 2, "tp": 2.0}), "decode_topo.tp"),
])
def test_mooncake_child_validation(args, field):
    with pytest.raises(PdError) as err:
        connectors.mooncake_child(*args)
    assert err.value.where == "pd_mooncake_child"
    assert err.value.field == field


@pytest.mark.parametrize("value", [0, -1, None, 1.5, "200GiB", True])
def test_offload_children_need_positive_int_bytes(value):
    with pytest.raises(PdError) as err:
        connectors.offloading_child(value, ROW)
    assert (err.value.where, err.value.field) == ("pd_offloading_child", "cpu_bytes_to_use")
    with pytest.raises(PdError) as err:
        connectors.recompute_child(value)
    assert (err.value.where, err.value.field) == ("pd_recompute_child", "cpu_bytes_to_use_per_rank")


def test_offloading_child_needs_a_row():
    with pytest.raises(PdError) as err:
        connectors.offloading_child(GIB, {"offloading_spec_name": "NPUOffloadingSpec"})
    assert err.value.where == "pd_offloading_child"
    with pytest.raises(PdError):
        connectors.offloading_child(GIB, ROW, blocks_per_chunk=0)


def _kv_args(**change):
    c = cluster()
    args = {"role_cfg": c["roles"]["decode"], "cluster": c, "instance": instance("decode", 30100),
            "row": ROW, "offload_bytes": 26843545600}
    args.update(change)
    return args


@pytest.mark.parametrize("change, field", [
    ({"role_cfg": None}, "role_cfg"),
    ({"cluster": []}, "cluster"),
    ({"instance": "decode0"}, "instance"),
    ({"role_cfg": role("both")}, "role_cfg.role"),
    ({"instance": instance("prefill", 30100)}, "instance.role"),
    ({"role_cfg": role("decode", offload_connector="Recompute")}, "decode.offload_connector"),
    ({"role_cfg": role("decode", mooncake="yes")}, "decode.mooncake"),
    ({"row": {}}, "row.offloading_spec_name"),
    ({"offload_bytes": None}, "cpu_bytes_to_use_per_rank"),
    ({"instance": instance("decode", None)}, "kv_port"),
])
def test_kv_transfer_config_validation(change, field):
    with pytest.raises(PdError) as err:
        connectors.kv_transfer_config(**_kv_args(**change))
    assert err.value.field == field
    assert err.value.where in ("pd_kv_transfer_config", "pd_mooncake_child", "pd_recompute_child")


def test_kv_transfer_config_validation_names_the_builder():
    with pytest.raises(PdError) as err:
        connectors.kv_transfer_config(**_kv_args(role_cfg=None))
    assert str(err.value).startswith("pd_kv_transfer_config: role_cfg:")


@pytest.mark.parametrize("role_cfg, row, field", [
    ("decode", ROW, "role_cfg"),
    (role("decode", recompute_scheduler="true"), ROW, "recompute_scheduler"),
    (role("decode", recompute_scheduler=True), {}, "row.offloading_spec_name"),
    (role("decode", recompute_scheduler=True), dict(ROW, recompute_scheduler_key="deep"),
     "row.recompute_scheduler_key"),
])
def test_additional_config_validation(role_cfg, row, field):
    with pytest.raises(PdError) as err:
        connectors.additional_config(role_cfg, row)
    assert err.value.where == "pd_additional_config"
    assert err.value.field == field


# ---- purity -----------------------------------------------------------------------------------

def test_builders_twice_equal_and_inputs_untouched():
    c = cluster()
    inst = instance("decode", 30100)
    row = versions.version_row("main")
    snapshot = copy.deepcopy((c, inst, row))
    calls = [
        lambda: connectors.kv_transfer_config(c["roles"]["decode"], c, inst, row, 26843545600),
        lambda: connectors.kv_transfer_config(c["roles"]["prefill"], c, dict(inst, role="prefill"),
                                              row, 100 * GIB),
        lambda: connectors.additional_config(c["roles"]["decode"], row),
        lambda: connectors.mooncake_child("decode", "MooncakeConnectorV1", 30100, c["roles"]["prefill"],
                                          c["roles"]["decode"]),
        lambda: connectors.offloading_child(100 * GIB, row),
        lambda: connectors.recompute_child(26843545600),
    ]
    for call in calls:
        first = call()
        # tamper with the first result: the second call must not see it
        if isinstance(first, dict):
            first.setdefault("kv_connector_extra_config", {})["tampered"] = True
            first["kv_role"] = "tampered"
        second = call()
        assert second == call()
        assert second != first
    assert (c, inst, row) == snapshot


def test_results_share_nothing_with_inputs():
    c = cluster()
    result = connectors.kv_transfer_config(c["roles"]["decode"], c, instance("decode", 30100), ROW, 1)
    moon = result["kv_connector_extra_config"]["connectors"][0]
    moon["kv_connector_extra_config"]["prefill"]["dp_size"] = 99
    assert c["roles"]["prefill"]["dp"] == 2


# ---- filters ----------------------------------------------------------------------------------

def test_article_d_rendered_through_json():
    # what the launch spec carries: the connector config as JSON text, read back equal to the article's
    c = cluster()
    row = versions.version_row("0.25.1")
    kv = connectors.kv_transfer_config(c["roles"]["decode"], c, instance("decode", 30100), row, 26843545600)
    add = connectors.additional_config(c["roles"]["decode"], row)
    assert json.loads(json.dumps(kv, separators=(",", ":"))) == ARTICLE_D_RENDERED
    assert json.loads(json.dumps(add)) == {"scheduler_config": {"recompute_scheduler_enable": True}}


# ---- <role>.kv_connector_engine: an engine that names the connectors differently (vLLM's CPU build)

VLLM_MOONCAKE = {"names": {"MooncakeConnectorV1": "MooncakeConnector"},
                 "extra_config": {"MooncakeConnectorV1": {"mooncake_protocol": "tcp"}}, "multi": True}


def _render_prefill(engine_map, offload="none", row="main", offload_bytes=None):
    c = cluster()
    c["roles"]["prefill"].update(offload_connector=offload, kv_connector_engine=engine_map)
    return connectors.kv_transfer_config(c["roles"]["prefill"], c, instance("prefill", 30000),
                                         versions.version_row(row), offload_bytes)


def test_engine_names_rename_add_extra_keys_and_wrap_one_child():
    result = _render_prefill(copy.deepcopy(VLLM_MOONCAKE))
    plain = _render_prefill(None)
    child = copy.deepcopy(plain)
    child["kv_connector"] = "MooncakeConnector"
    child["kv_connector_extra_config"] = dict(child["kv_connector_extra_config"], mooncake_protocol="tcp")
    assert result == {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
                      "kv_connector_extra_config": {"connectors": [child]}}


def test_engine_names_null_or_empty_render_as_before():
    assert _render_prefill({}) == _render_prefill(None)
    assert _render_prefill(None)["kv_connector"] == "MooncakeConnectorV1"


def test_engine_names_leave_unnamed_children_alone():
    result = _render_prefill({"names": {"OffloadingConnector": "PdTestConnector"}},
                             offload="OffloadingConnector", offload_bytes=GIB)
    kids = result["kv_connector_extra_config"]["connectors"]
    assert [k["kv_connector"] for k in kids] == ["MooncakeConnectorV1", "PdTestConnector"]
    assert kids[1]["kv_connector_extra_config"]["cpu_bytes_to_use"] == GIB


@pytest.mark.parametrize("engine_map, field", [
    # a key the renderer owns for the Mooncake child (the P/D topology)
    ({"extra_config": {"MooncakeConnectorV1": {"prefill": {}}}},
     "prefill.kv_connector_engine.extra_config.MooncakeConnectorV1.prefill"),
    ({"names": {"MooncakeHybridConnector": "MooncakeConnector"}},
     "prefill.kv_connector_engine.names.MooncakeHybridConnector"),
    ({"extra_config": {"OffloadingConnector": {"x": 1}}},
     "prefill.kv_connector_engine.extra_config.OffloadingConnector"),
    ({"multi": "yes"}, "prefill.kv_connector_engine.multi"),
    ({"rename": {}}, "prefill.kv_connector_engine.rename"),
    ({"names": {"MooncakeConnectorV1": ""}}, "prefill.kv_connector_engine.names.MooncakeConnectorV1"),
])
def test_engine_names_refuse_what_the_renderer_owns_or_does_not_render(engine_map, field):
    with pytest.raises(PdError) as err:
        _render_prefill(engine_map)
    assert err.value.field == field
    assert err.value.fix
    assert err.value.where == "cluster_a/prefill"


def test_engine_names_leave_the_input_untouched():
    engine_map = copy.deepcopy(VLLM_MOONCAKE)
    _render_prefill(engine_map)
    assert engine_map == VLLM_MOONCAKE


@pytest.mark.parametrize("prefill_offload, decode_offload", [
    ("OffloadingConnector", "RecomputeCPUOffloadConnector"), ("none", "none")])
def test_no_engine_id_is_rendered_so_each_process_gets_its_own(prefill_offload, decode_offload):
    """issue 20 #2: a decode caches a prefill's KV addresses per engine id and never drops them
    (versions.yml kv_peer_cache); a fixed id makes a restarted prefill a stale entry. Neither the
    MultiConnector nor a child may carry one, with or without offload, on every row."""
    c = cluster()
    c["roles"]["prefill"]["offload_connector"] = prefill_offload
    c["roles"]["decode"]["offload_connector"] = decode_offload
    for line in versions.known_versions():
        row = versions.version_row(line)
        for name, kv_port, offload_bytes in (("prefill", 30000, 100 * GIB), ("decode", 30100, 26843545600)):
            result = connectors.kv_transfer_config(c["roles"][name], c, instance(name, kv_port), row, offload_bytes)
            holders = [result] + result["kv_connector_extra_config"].get("connectors", [])
            assert [h for h in holders if "engine_id" in h] == [], (line, name, result)
