"""plugin_utils.ops.monitoring: Prometheus scrape configuration and Grafana dashboard of a fleet plan.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy
import json

import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import monitoring
from tests.fixtures.ops_inputs import CLUSTER, PLAN, plan_of


def test_scrape_config_lists_every_rank_and_probes_the_proxy():
    two = copy.deepcopy(CLUSTER)
    two["name"] = "c2"
    two.update(proxy={"port": 9000}, prefill=dict(two["prefill"], port_base=9100, kv_port=29000, dp_rpc_port=14389),
               decode=dict(two["decode"], port_base=9200, kv_port=29100, dp_rpc_port=14399))
    fleet_plan = plan_of(CLUSTER)
    other = plan_of(two, ("c2-p0",), ("c2-d0",))
    fleet_plan["clusters"].update(other["clusters"])
    fleet_plan["hosts"].update(other["hosts"])
    config = monitoring.prometheus_scrape_config(fleet_plan)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"pd-c1", "pd-c1-proxy", "pd-c2", "pd-c2-proxy"}
    for cluster in ("c1", "c2"):
        specs = [s for h in fleet_plan["clusters"][cluster]["hosts"] for s in fleet_plan["hosts"][h]["specs"]]
        got = {(t["targets"][0], t["labels"]["instance"], t["labels"]["role"], t["labels"]["dp_rank"])
               for t in jobs[f"pd-{cluster}"]["static_configs"]}
        want = {(f"{s['env']['HCCL_IF_IP']}:{s['ports']['http']}", s["name"], s["role"], str(s["dp_rank"]))
                for s in specs}
        assert got == want and len(specs) == 4
        assert all(t["labels"]["cluster"] == cluster for t in jobs[f"pd-{cluster}"]["static_configs"])
        proxy = fleet_plan["clusters"][cluster]["proxy"]
        probe = jobs[f"pd-{cluster}-proxy"]
        assert probe["static_configs"][0]["targets"][0].endswith(f":{proxy['ports']['http']}/healthcheck")
        assert probe["relabel_configs"][-1]["replacement"] == "127.0.0.1:9115"
    yaml.safe_load(yaml.safe_dump(config))


def test_dashboard_has_a_panel_per_pitfall_signal():
    dash = monitoring.grafana_dashboard(PLAN)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    assert "vllm:num_requests_running" in exprs["Requests running"]
    assert "vllm:num_requests_waiting" in exprs["Requests waiting"]
    assert "vllm:kv_cache_usage_perc" in exprs["KV cache usage"]
    assert "rate(vllm:num_preemptions_total" in exprs["Preemptions per second"]
    ttft = exprs["Time to first token p50 / p95"]
    assert "histogram_quantile(0.5," in ttft and "histogram_quantile(0.95," in ttft
    assert "vllm:time_to_first_token_seconds_bucket" in ttft
    assert "probe_success" in exprs["Proxy up"]
    kv = next(p for p in dash["panels"] if p["title"] == "KV cache usage")
    assert {"color": "red", "value": 0.9} in kv["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    json.dumps(dash)
