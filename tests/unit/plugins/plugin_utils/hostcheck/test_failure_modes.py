"""Failure modes of the known-failure table caught before any container starts (issue 13 #6).

Every entry of plugins/plugin_utils/data/known_failures.yml with a ``caught_by`` is triggered here through what
catches it: an inventory rule (rules.check_cluster on a real topology), a host precheck fed by the probe's
own readers (a port really squatted on 127.0.0.1, the fake npu-smi and hccn_tool variants, missing
mounts), or the compatibility check. A test per entry id; the first test keeps the two lists equal.
"""

import copy
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import compat, netchecks, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import model
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import failures
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import rules

from tests.unit.plugins.plugin_utils.hostcheck import test_netchecks as nc  # fake hccn_tool helpers
from tests.unit.plugins.plugin_utils.hostcheck import test_prechecks as pc  # a healthy decode host's probe facts

REPO = Path(__file__).resolve().parents[5]
GIB = 1024 ** 3


def violations(**decode_over):
    """Rule violations of the example cluster with the decode role changed (and prefill per ``prefill``)."""
    prefill = decode_over.pop("prefill", {})
    raw = {"name": "cluster_a", "vllm_ascend_version": "0.25.1", "image": "quay.io/ascend/vllm-ascend:v0.25.1rc1",
           "model": {"path": pc.MODEL_PATH},
           "prefill": prefill,
           "decode": {"offload_connector": "RecomputeCPUOffloadConnector", "cpu_offload": "200GiB",
                      "recompute_scheduler": True, **decode_over}}
    cluster = model.normalize("cluster_a", raw)
    facts = {"pd_host_ram": "1TiB", "pd_hccl_if": "enp189s0f0"}
    hosts = [model.host_record("a-p0", "prefill", dict(facts, pd_host_address="10.0.0.11")),
             model.host_record("a-d0", "decode", dict(facts, pd_host_address="10.0.0.12"))]
    topo, _ = model.topology(cluster, hosts)
    return [v for v in rules.check_cluster(cluster, topo) if v["level"] == "error"]


def fields(vs):
    return [v["field"] for v in vs]


def test_every_caught_entry_has_a_test_here():
    caught = {e["id"] for e in failures.table() if e.get("caught_by")}
    tested = {name[len("test_caught_"):].replace("_", "-") for name in globals() if name.startswith("test_caught_")}
    assert caught == tested
    assert violations() == [], "the unchanged example cluster breaks no rule"


def test_caught_address_in_use():
    # a port really squatted on 127.0.0.1, read back by the probe's /proc/net/tcp reader
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        facts = pc.good_facts()
        facts["specs"][0]["ports"]["http"] = port
        facts["probe"]["listening_ports"] = nc.probe_mod.listening_ports(
            nc.probe_mod.read_text("/proc/net/tcp"), nc.probe_mod.read_text("/proc/net/tcp6"))
        found = prechecks.problems(facts)
    assert [m for m in found if f"ports {port} needed by {facts['specs'][0]['name']} are already in use" in m]


def test_caught_shm_too_small():
    # 1GiB of /dev/shm for 100GiB pinned offload per decode container (200GiB over its 2 DP ranks)
    assert "decode.shm_size" in fields(violations(shm_size="1GiB"))


def test_caught_recompute_on_producer():
    assert "prefill.recompute_scheduler" in fields(violations(prefill={"recompute_scheduler": True}))


def test_caught_npu_oom():
    assert "decode.engine.gpu_memory_utilization" in fields(violations(engine={"gpu_memory_utilization": 0.96}))


def test_caught_host_oom():
    facts = pc.good_facts()
    facts["probe"]["meminfo"] = pc.meminfo(256 * GIB)  # < 200GiB pinned + 128GiB reserve
    [msg] = prechecks.problems(facts)
    assert "RAM 256GiB < pinned CPU offload 200GiB" in msg


def test_caught_visible_devices():
    # the fake npu-smi with 4 NPUs while the ranks use /dev/davinci0..7
    out = subprocess.run([str(REPO / "tests/fixtures/ascend/npu-smi"), "info", "-l"], capture_output=True,
                         text=True, env={"PD_FAKE_NPUS": "4", "PATH": "/usr/bin:/bin"}, check=False)
    facts = pc.good_facts()
    facts["probe"]["npu_smi"] = {"rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr}
    [msg] = prechecks.problems(facts)
    assert msg.startswith(f"{pc.HOST}: npu-smi reports 4 NPUs but this host's ranks use 8")


def test_caught_device_ip_not_set(tmp_path):
    # wrong mounts: /etc/hccn.conf absent on the host, seen both by the path check and the hccn check
    facts = pc.good_facts()
    facts["probe"]["stats"]["/etc/hccn.conf"] = {"exists": False, "isdir": False, "ischr": False}
    [msg] = prechecks.problems(facts)
    assert "/etc/hccn.conf is missing" in msg
    hccn = nc.probe(nc.fake_host(tmp_path, "h", conf=False), npus=[0])
    [msg] = netchecks.host_problems("h", hccn, [0])
    assert "/etc/hccn.conf is missing" in msg


def test_caught_hccl_timeout(tmp_path):
    # a prefill NPU whose link is down, and a decode NPU no prefill NPU can reach
    hccn = nc.probe(nc.fake_host(tmp_path, "p", variant="PD_FAKE_HCCN_LINK_DOWN=2\n"), npus=[2])
    [msg] = netchecks.host_problems("p", hccn, [2])
    assert "link status DOWN" in msg
    target = [{"device": 0, "address": "198.51.100.10", "peer": "d", "peer_device": 0}]
    ran = nc.probe(nc.fake_host(tmp_path, "p2", variant="PD_FAKE_HCCN_UNREACHABLE=198.51.100.10\n"), npus=[],
                   ping=netchecks.ping_request(target))["ping"]
    assert netchecks.ping_problems("p2", target, ran)


def test_caught_kv_transfer_params():
    # P and D images built from different rows: each is checked against the row, so one of them fails
    history_023 = ["|3 MOONCAKE_TAG=0.3.11.post1 VLLM_COMMIT= VLLM_TAG=v0.23.0 /bin/sh -c true"]
    found = compat.problems({"host": "h", "vllm_ascend_version": "0.25.1",
                             "compat": {"images": {"old:1": {"history": history_023}}, "driver_info": "Version=1\n"}})
    assert len(found) == 1 and "built with vllm 0.23.0" in found[0]


@pytest.mark.parametrize("entry", [e for e in failures.table() if not e.get("caught_by")], ids=lambda e: e["id"])
def test_entries_caught_only_after_start_say_so(entry):
    # these are found by the post-deploy scan only; the table says why nothing earlier can see them
    assert entry["severity"] in ("fail", "warn") and entry["fix"]


def test_copy_is_untouched():
    # good_facts returns fresh copies: the tests above did not change the module's SPECS
    assert pc.SPECS == copy.deepcopy(pc.decode_specs())
