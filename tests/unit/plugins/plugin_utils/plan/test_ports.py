"""plugin_utils.ports: Mooncake's transport window by version, HCCL windows per instance, port limits.

Expected numbers are typed from the sources (kvcache-ai/Mooncake tags, CANN's HCCL_IF_BASE_PORT
reference), never read from plugins/plugin_utils/data/ports.yml.
"""

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import launch, model, ports, versions
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import datafiles
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import rules


def plan(raw, hosts):
    cluster = model.normalize(raw["name"], raw)
    topo, problems = model.topology(cluster, hosts)
    specs = {r["container"]: launch.rank_spec(cluster, i, r, topo["hosts"][r["host"]])
             for i in topo["instances"] for r in i["ranks"]}
    return cluster, topo, problems, specs


def raw(**over):
    base = {"name": "c", "vllm_ascend_version": "0.25.1", "image": "img:1", "model": {"path": "/m"}}
    base.update(over)
    return base


def host(name, role, address, **hv):
    return model.host_record(name, role, dict({"pd_host_address": address, "pd_hccl_if": "eth0",
                                               "pd_host_ram": "1TiB"}, **hv))


def errors(cluster, topo, field=None):
    return [v for v in rules.check_cluster(cluster, topo)
            if v["level"] == "error" and (field is None or v["field"] == field)]


# ---- Mooncake versions --------------------------------------------------------------------------

@pytest.mark.parametrize("version, stride, device_id, env", [
    ("0.3.7", 1000, "visible", None),            # v0.3.7: base_port_ + dev_id * 1000, fixed base
    ("0.3.7.post2", 1000, "visible", None),
    ("0.3.8", 100, "visible", "ASCEND_BASE_PORT"),  # v0.3.8: * 100, getenv("ASCEND_BASE_PORT")
    ("0.3.10", 100, "visible", "ASCEND_BASE_PORT"),
    ("0.3.10.post1", 100, "physical", "ASCEND_BASE_PORT"),  # aclrtGetPhyDevIdByLogicDevId
    ("0.3.11.post1", 100, "physical", "ASCEND_BASE_PORT"),
    ("v0.3.12", 100, "physical", "ASCEND_BASE_PORT"),
])
def test_transport_row_by_mooncake_version(version, stride, device_id, env):
    row = ports.mooncake_transport(version)
    assert (row["stride"], row["device_id"], row["base_port_env"], row["base_port"]) == \
        (stride, device_id, env, 20000)


def test_mooncake_before_the_ascend_transport_and_bad_versions():
    assert ports.mooncake_transport("0.3.6.post1") is None
    with pytest.raises(PdError, match="mooncake_version"):
        ports.mooncake_transport("latest")


def test_every_transport_row_and_window_has_a_source():
    data = datafiles.yaml_data("ports.yml")
    assert all(row.get("source") for row in data["mooncake"]["transport"])
    assert data["mooncake"]["rpc_source"] and data["hccl"]["source"]


def test_every_version_row_names_its_images_mooncake():
    # vllm-ascend Dockerfile ARG MOONCAKE_TAG=0.3.11.post1 at v0.23.0 .. main
    for line in versions.known_versions():
        assert versions.version_row(line if line == "main" else line + ".0")["mooncake_version"] == "0.3.11.post1"


def test_old_mooncake_widens_the_window_to_1000_per_npu():
    # an image with Mooncake 0.3.7.post2: NPUs 0..7 -> 20000..28000, so kv 28000 is taken, 28001 free
    cluster, topo, _, _ = plan(raw(prefill={"kv_port": 28000}), [host("p", "prefill", "10.0.0.1"),
                                                                    host("d", "decode", "10.0.0.2")])
    row = dict(versions.version_row("0.25.1"), mooncake_version="0.3.7.post2")
    found = [v for v in ports.check(ports.claims(cluster, topo, row)) if v["field"] == "prefill.kv_port"]
    assert found and found[0]["fix"] == "set prefill.kv_port >= 28001"
    cluster["roles"]["prefill"]["kv_port"] = 28001
    topo = model.topology(cluster, [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])[0]
    assert [v for v in ports.check(ports.claims(cluster, topo, row)) if v["field"] == "prefill.kv_port"] == []


# ---- HCCL windows -------------------------------------------------------------------------------

def test_two_instances_on_one_host_get_their_own_hccl_window():
    # two P instances of DP1 x TP4 share an 8-NPU host: instance 0 keeps HCCL's default (nothing
    # rendered, as upstream), instance 1 starts 32 ports higher
    cluster, topo, problems, specs = plan(raw(prefill={"instances": 2, "dp": 1}),
                                          [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    assert "HCCL_IF_BASE_PORT" not in specs["pd-c-prefill0-dp0"]["env"]
    assert specs["pd-c-prefill1-dp0"]["env"]["HCCL_IF_BASE_PORT"] == "60032"
    assert "HCCL_IF_BASE_PORT" not in specs["pd-c-decode0-dp0"]["env"]
    assert errors(cluster, topo, "hccl_if_base_port") == []


def test_ranks_of_one_instance_share_its_window():
    _, _, _, specs = plan(raw(), [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    assert all("HCCL_IF_BASE_PORT" not in s["env"] for s in specs.values())


def test_operator_hccl_base_shared_by_two_instances_is_an_error():
    cluster, topo, _, _ = plan(raw(prefill={"instances": 2, "dp": 1, "env": {"HCCL_IF_BASE_PORT": "50000"}}),
                               [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    found = errors(cluster, topo, "prefill.env.HCCL_IF_BASE_PORT")
    assert found and "50000..50031" in found[0]["message"]
    assert found[0]["where"] == "c/prefill/instance 1@p"


def test_ports_past_65535_name_host_field_and_fix():
    cluster, topo, _, _ = plan(raw(hccl_if_base_port=65520, prefill={"instances": 2, "dp": 1}),
                               [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    found = errors(cluster, topo, "hccl_if_base_port")
    # instance 0: 65520..65551 already ends past 65535; instance 1 starts at 65552
    assert any(v["where"] == "c/prefill/instance 0@p" and "65520..65551" in v["message"]
               and "go past 65535" in v["message"] for v in found)
    assert any("outside 1024..65520" in v["message"] for v in found)
    cluster, topo, _, _ = plan(raw(decode={"kv_port": 65530}),
                               [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    found = errors(cluster, topo, "decode.kv_port")
    assert any("65530..65537" in v["message"] and v["where"] == "c/decode/instance 0@d" for v in found)


def test_rendered_port_in_the_handshake_rpc_window():
    cluster, topo, _, _ = plan(raw(decode={"port_base": 16000}),
                               [host("p", "prefill", "10.0.0.1"), host("d", "decode", "10.0.0.2")])
    found = errors(cluster, topo, "decode.port_base")
    assert found and "15000..17000" in found[0]["message"] and found[0]["fix"] == \
        "move decode.port_base out of 15000..17000"
