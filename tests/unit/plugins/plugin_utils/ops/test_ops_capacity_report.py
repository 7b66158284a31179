"""plugin_utils.ops.capacity_report: KV budget against the configured concurrency, and its chart.

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy
import json
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import baseline, capacity_report, common
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity, model
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from tests.fixtures.ops_inputs import CLUSTER, FIXED, GIB, LENGTHS, MARGINAL, P99, PLAN, plan_of, vllm_log


def test_capacity_report_uses_the_measured_fit_and_says_so():
    summary = PLAN["clusters"]["c1"]
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    measured = baseline.baseline_report(boots)
    report = capacity_report.capacity_report(summary, measured, CLUSTER)
    assert report["source"] == "measured"
    d = report["roles"]["decode"]
    cap = summary["capacity"]["decode"]
    fit = measured["fits"]["all"]["fit"]
    per_worker = cap["kv_budget_per_dp_group_bytes"] // cap["tp"]
    footprint = fit["fixed_bytes_per_request"] + fit["marginal_bytes_per_token"] * P99
    assert d["kv_budget_per_worker_bytes"] == per_worker
    assert d["footprint_at_p99_bytes"] == round(footprint)
    assert d["requests_fit_per_dp_group_at_p99"] == int(per_worker // footprint)
    need = cap["max_num_seqs_per_dp_group"] * footprint * cap["tp"]
    mem = d["memory_at_configured_concurrency"]
    assert mem["per_dp_group_bytes"] == round(need)
    assert mem["per_instance_bytes"] == round(need * cap["dp"])
    assert mem["max_num_seqs_that_fit"] == int(per_worker // footprint)
    assert "measured" in d["bytes_model"]["source"]
    p = report["roles"]["prefill"]["expected_concurrency"]
    # per instance = DP x per DP group; both limits are per DP group (article §3.4)
    assert p["configured"]["concurrency"] == 2 * max(1, min(32, 8192 // 16384))
    rec = capacity.recommend_batched_tokens(16384, tp=4)["recommended"]
    assert p["recommended"]["concurrency"] == 2 * max(1, min(32, rec // 16384))
    assert "| D memory at configured concurrency (instance) |" in report["markdown"]


def test_capacity_report_without_baseline_uses_the_configured_estimate():
    report = capacity_report.capacity_report(PLAN["clusters"]["c1"], None, CLUSTER)
    est = common.model_estimate("deepseek_v4_flash")
    assert report["source"] == "estimate"
    assert report["roles"]["decode"]["bytes_model"]["marginal_bytes_per_token"] == est["marginal_bytes_per_token"]
    assert "configured estimate" in report["roles"]["decode"]["bytes_model"]["source"]
    assert any("unknown until playbooks/baseline.yml" in n for n in report["roles"]["decode"]["notes"])
    # without the cluster's config the defaults' workload is used
    assert capacity_report.capacity_report(PLAN["clusters"]["c1"])["workload"] == model.defaults()["cluster"]["workload"]
    with pytest.raises(PdError):
        capacity_report.capacity_report({"capacity": None})


def test_capacity_warns_when_d_concurrency_cannot_fit():
    raw = copy.deepcopy(CLUSTER)
    raw["decode"]["engine"]["max_num_seqs"] = 256
    # derived: max_num_seqs x (1 + speculative tokens), what the decode rule asks for
    raw["decode"]["engine"]["max_num_batched_tokens"] = None
    measured = baseline.baseline_report([{"max_model_len": L, "log_text": vllm_log(L, 2 * GIB, MARGINAL)} for L in LENGTHS])
    report = capacity_report.capacity_report(plan_of(raw)["clusters"]["c1"], measured, raw)
    d = report["roles"]["decode"]
    assert d["memory_at_configured_concurrency"]["share_of_budget"] > 1
    assert any("expect preemptions" in n for n in d["notes"])


def test_capacity_chart_is_well_formed_svg_with_a_bar_per_figure():
    report = capacity_report.capacity_report(PLAN["clusters"]["c1"], None, CLUSTER)
    svg = capacity_report.capacity_chart_svg(report)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    bars = [r for r in root.iter(f"{ns}rect")][1:]      # the first rect is the background
    assert len(bars) == 3 * len(report["roles"])
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert "decode: KV budget per DP group" in labels
    budget = report["roles"]["decode"]["kv_budget_per_dp_group_bytes"]
    assert f"{budget / GIB:.1f}" in labels
    hostile = dict(report, cluster="<a&b>")
    ET.fromstring(capacity_report.capacity_chart_svg(hostile))


def test_capacity_reports_computes_every_cluster_in_one_call_with_each_baseline(tmp_path):
    """capacity_report.yml's one controller computation: a baseline file applies to its own cluster."""
    other = dict(copy.deepcopy(CLUSTER), name="c2")
    plan = plan_of(CLUSTER)
    plan["clusters"]["c2"] = plan_of(other, ("c2-p0",), ("c2-d0",))["clusters"]["c2"]
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    measured = baseline.baseline_report(boots, config=CLUSTER)
    reports = capacity_report.capacity_reports(plan, ["c1", "c2"], {"c1": CLUSTER, "c2": other},
                                               {f"{tmp_path}/c1/baseline.json": json.dumps(measured)})
    assert sorted(reports) == ["c1", "c2"]
    assert reports["c1"] == capacity_report.capacity_report(plan["clusters"]["c1"], measured, CLUSTER)
    assert reports["c2"] == capacity_report.capacity_report(plan["clusters"]["c2"], None, other)
    assert (reports["c1"]["source"], reports["c2"]["source"]) == ("measured", "estimate")
    files = capacity_report.capacity_report_files(reports, "/r")
    assert [f["path"] for f in files] == [f"/r/{c}/capacity.{x}" for c in ("c1", "c2") for x in ("json", "md", "svg")]
    body = json.loads(files[0]["content"])
    assert "markdown" not in body and body["source"] == "measured"
    assert files[1]["content"] == reports["c1"]["markdown"]
    ET.fromstring(files[2]["content"])


def test_capacity_reports_errors_name_the_file_and_the_cluster():
    with pytest.raises(PdError, match=r"/r/c1/baseline.json: is not JSON"):
        capacity_report.capacity_reports(PLAN, ["c1"], None, {"/r/c1/baseline.json": "{oops"})
    with pytest.raises(PdError, match=r"'nope' is not a cluster of the plan"):
        capacity_report.capacity_reports(PLAN, ["nope"])
