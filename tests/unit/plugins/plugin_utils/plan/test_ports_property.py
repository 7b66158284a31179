"""Property: whenever validation accepts a fleet, no two ports of one host collide.

Fleets are generated (clusters, instances, DP, TP, hosts with shared addresses, port bases, HCCL
and Mooncake bases). For every accepted fleet the ports each container will really take are read
back from the rendered launch specs, independently of plugins/plugin_utils/ports.py, from upstream's facts:

* ``--port``; ``--data-parallel-rpc-port`` on DP rank 0 (vLLM binds it on the DP master);
* Mooncake handshake ports: rank r of a DP x TP instance listens on kv_port + r x TP + tp_rank
  (vllm-ascend main, vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_hybrid_connector.py,
  side_channel_port and handshake_port);
* Mooncake 0.3.11.post1 (the images' ARG MOONCAKE_TAG): per NPU a random port of
  ASCEND_BASE_PORT (20000) + physical id x 100 .. + (id + 1) x 100, both ends
  (kvcache-ai/Mooncake v0.3.11.post1 ascend_direct_transport/utils.cpp FindAdxlListenPort), and the
  handshake RPC port 15000..17000 (include/config.h);
* HCCL: HCCL_IF_BASE_PORT (60000) and the next 31 (CANN 8.5 environment variable reference);
* the proxy's ``--port``.

Physical ids come from the container view: ASCEND_RT_VISIBLE_DEVICES entry v is the v-th davinci
node the spec mounts.
"""

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet

TRANSPORT_BASE, TRANSPORT_STRIDE = 20000, 100
RPC_WINDOW = (15000, 17000)
HCCL_DEFAULT, HCCL_SPAN = 60000, 32


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def _mooncake_kv_port(cmd):
    text = _arg(cmd, "--kv-transfer-config")
    if text is None:
        return None
    cfg = json.loads(text)
    kids = cfg.get("kv_connector_extra_config", {}).get("connectors") \
        if cfg.get("kv_connector") == "MultiConnector" else [cfg]
    for kid in kids or []:
        if str(kid.get("kv_connector", "")).startswith("Mooncake"):
            return int(kid["kv_port"])
    return None


def port_uses(plan):
    """{address: [(lo, hi, kind, owner)]} of every accepted spec, read from the specs alone."""
    # host -> address: every rank's env carries HCCL_IF_IP = its host's address
    address = {}
    for h in plan["hosts"].values():
        for spec in h["specs"]:
            address[spec["host"]] = spec["env"]["HCCL_IF_IP"]
    out = {}
    for h in plan["hosts"].values():
        for spec in h["specs"]:
            addr, cmd, env = address[spec["host"]], spec["command"], spec["env"]
            owner = (spec["cluster"], spec["role"], spec["instance"])
            rank_owner = owner + (spec["dp_rank"],)
            uses = out.setdefault(addr, [])
            port = int(_arg(cmd, "--port"))
            uses.append((port, port, "http", rank_owner))
            # a DP-1 instance runs without the external-DP flags (vLLM 0.27.1 refuses them)
            if spec["dp_rank"] == 0 and _arg(cmd, "--data-parallel-rpc-port") is not None:
                rpc = int(_arg(cmd, "--data-parallel-rpc-port"))
                uses.append((rpc, rpc, "dp_rpc", owner))
            base = int(env.get("HCCL_IF_BASE_PORT", HCCL_DEFAULT))
            uses.append((base, base + HCCL_SPAN - 1, "hccl", owner))
            kv = _mooncake_kv_port(cmd)
            if kv is None:
                continue
            tp, r = int(_arg(cmd, "--tensor-parallel-size")), spec["dp_rank"]
            uses.append((kv + r * tp, kv + (r + 1) * tp - 1, "kv", rank_owner))
            mounted = sorted(int(m.group(1)) for d in spec["devices"]
                             if (m := re.search(r":/dev/davinci(\d+)$", d)))
            phys = [mounted[int(v)] for v in env["ASCEND_RT_VISIBLE_DEVICES"].split(",")]
            tbase = int(env.get("ASCEND_BASE_PORT", TRANSPORT_BASE))
            uses.append((tbase + min(phys) * TRANSPORT_STRIDE, tbase + (max(phys) + 1) * TRANSPORT_STRIDE,
                         "transport", rank_owner))
            uses.append(RPC_WINDOW + ("mooncake_rpc", rank_owner))
        if h["proxy"]:
            spec = h["proxy"]
            port = int(_arg(spec["command"], "--port"))
            out.setdefault(address[spec["host"]], []).append((port, port, "proxy", (spec["cluster"], "proxy")))
    return out


def allowed_overlap(a, b):
    """Overlaps that are not collisions: two Mooncake random windows (it retries a taken port), the
    HCCL window shared by the ranks of one instance, the same claim of one instance twice."""
    moon = ("transport", "mooncake_rpc")
    if a[2] in moon and b[2] in moon:
        return True
    return a[2] == b[2] and a[3] == b[3]


def assert_no_collision(plan):
    for addr, uses in port_uses(plan).items():
        for i, a in enumerate(uses):
            assert 1 <= a[0] <= a[1] <= 65535, (addr, a)
            for b in uses[:i]:
                if a[0] <= b[1] and b[0] <= a[1]:
                    assert allowed_overlap(a, b), (addr, a, b)
        tops = [u[1] for u in uses if u[2] == "transport"]
        for kv in (u for u in uses if u[2] == "kv"):
            assert not tops or kv[0] > max(tops), (addr, kv, max(tops))


# ---- generated fleets ---------------------------------------------------------------------------

def port(draw, good):
    """Mostly the lane's non-overlapping value (so that many fleets are accepted), sometimes any
    port, sometimes a well-known one (defaults and the edges of Mooncake's and HCCL's windows)."""
    kind = draw(st.sampled_from(["good"] * 6 + ["any", "known"]))
    if kind == "good":
        return good
    if kind == "known":
        return draw(st.sampled_from([8000, 8100, 13389, 15000, 17000, 20000, 20800, 20801, 21600,
                                     30000, 60000, 60031, 60032, 65535]))
    return draw(st.integers(1024, 65535))


@st.composite
def roles(draw, lane, offset, tp_max):
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= tp_max]))
    return {"instances": draw(st.integers(1, 2)), "dp": draw(st.sampled_from([1, 2, 4])), "tp": tp,
            "port_base": port(draw, 8100 + 1000 * lane + offset),
            "kv_port": port(draw, 30000 + 1000 * lane + 5 * offset),
            "dp_rpc_port": port(draw, 13000 + 100 * lane + offset // 10)}


@st.composite
def fleets(draw):
    addresses = [f"10.0.0.{i}" for i in range(1, draw(st.integers(1, 4)) + 1)]
    hosts = []
    # hosts sharing an address are one machine: they take disjoint NPUs of it
    next_npu = dict.fromkeys(addresses, 0)
    for c in range(draw(st.integers(1, 2))):
        name = f"c{c}"
        lane = c if draw(st.integers(0, 5)) else draw(st.integers(0, 1))
        prefill = draw(roles(lane, 0, 8))
        raw = {"name": name, "vllm_ascend_version": draw(st.sampled_from(["0.23.0", "0.25.1", "main"])),
               "image": "img:1", "model": {"path": "/m"},
               "proxy": {"port": port(draw, 8000 + 1000 * lane)},
               "prefill": prefill, "decode": draw(roles(lane, 100, prefill["tp"]))}
        if lane or draw(st.booleans()):
            raw["hccl_if_base_port"] = port(draw, 60000 + 256 * lane)
        for role in ("prefill", "decode"):
            if not draw(st.integers(0, 3)):
                raw[role]["env"] = {"ASCEND_BASE_PORT": str(port(draw, 20000))}
        npus = draw(st.sampled_from([8, 16]))
        for role in ("prefill", "decode"):
            r = raw[role]
            count = max(1, -(-r["instances"] * r["dp"] * r["tp"] // npus))
            for h in range(count):
                address = draw(st.sampled_from(addresses))
                hosts.append({"name": f"{name}-{role[0]}{h}", "groups": ["pd_clusters", name, role],
                              "vars": {"pd_cluster": raw, "pd_host_address": address,
                                       "pd_npu_first": next_npu[address], "pd_npus": npus,
                                       "pd_host_ram": "1TiB", "pd_hccl_if": "eth0",
                                       # ports are under test, not whether the weights fit: HBM so large
                                       # that every generated DP x TP holds them
                                       "pd_hbm_per_npu": "1TiB"}})
                next_npu[address] += npus
    return {"hosts": hosts, "limit": None}


ACCEPTED = []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_accepted_fleets_have_no_port_collision_on_any_host(f):
    plan = fleet.plan_fleet(f)
    if not plan["ok"]:
        return
    ACCEPTED.append(len(f["hosts"]))
    assert_no_collision(plan)


def test_the_property_saw_accepted_fleets():
    # runs after the property in file order: it must not have passed by rejecting everything
    assert len(ACCEPTED) >= 10, ACCEPTED


def test_the_checker_itself_finds_a_collision():
    # two clusters whose prefill hosts share 10.0.0.1 and HCCL's default window: validation refuses
    # it, and the independent checker above sees the same collision in what would be rendered
    raw = {"name": "c0", "vllm_ascend_version": "0.25.1", "image": "img:1", "model": {"path": "/m"}}
    raw2 = dict(raw, name="c1", proxy={"port": 9000},
                prefill={"port_base": 9100, "kv_port": 31000, "dp_rpc_port": 14000},
                decode={"port_base": 9200, "kv_port": 31100, "dp_rpc_port": 14001})
    f = {"hosts": [
        {"name": n, "groups": ["pd_clusters", c["name"], role],
         "vars": {"pd_cluster": c, "pd_host_address": addr, "pd_host_ram": "1TiB", "pd_hccl_if": "eth0",
                  "pd_npu_first": first}}
        for n, c, role, addr, first in (("p0", raw, "prefill", "10.0.0.1", 0), ("d0", raw, "decode", "10.0.0.2", 0),
                                        ("p1", raw2, "prefill", "10.0.0.1", 8), ("d1", raw2, "decode", "10.0.0.3", 0))],
        "limit": None}
    plan = fleet.plan_fleet(f)
    assert plan["ok"] is False
    assert any("hccl_if_base_port" in m for m in plan["messages"])
    try:
        assert_no_collision(plan)
    except AssertionError:
        return
    raise AssertionError("the independent checker missed the shared HCCL window")
