"""plugin_utils.ops as a whole: its steps are pure and their public filters usable from Jinja; the operations
playbooks run against stand-in HTTP servers on 127.0.0.1 (no Docker, no other network).

Expected values are derived from the inputs each test writes (a chosen fixed + marginal footprint, the
metrics values served, the cluster configuration), never copied from the code's output.
"""

import copy
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

from ansible_collections.pd.deploy.plugins.plugin_utils.ops import baseline, capacity_report, common, diagnosis, monitoring
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import model
from tests.fixtures.ops_inputs import CLUSTER, FIXED, LENGTHS, MARGINAL, PLAN, StandIn, answer_words, page, vllm_log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))


def _plugin_filters():
    from ansible_collections.pd.deploy.plugins.filter import pd
    return pd.FilterModule().filters()


def test_calls_do_not_change_their_inputs_or_depend_on_earlier_calls():
    samples = [page({"preemptions": 0, "kv": 0.95}), page({"preemptions": 3, "kv": 0.95})]
    raw = copy.deepcopy(CLUSTER)
    plan = copy.deepcopy(PLAN)
    first = diagnosis.diagnose(samples, "decode", raw)
    assert diagnosis.diagnose(samples, "decode", raw) == first
    assert raw == CLUSTER and plan == PLAN
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    assert baseline.baseline_report(boots) == baseline.baseline_report(copy.deepcopy(boots))
    report = capacity_report.capacity_report(plan["clusters"]["c1"], None, raw)
    assert capacity_report.capacity_report(plan["clusters"]["c1"], None, raw) == report
    assert monitoring.prometheus_scrape_config(plan) == monitoring.prometheus_scrape_config(plan)
    assert plan == PLAN
    common.models()["deepseek_v4_flash"]["bytes_per_token"]["max"] = 1
    assert common.model_band()["max"] > 1


def test_filters_work_through_jinja_native_templates():
    env = NativeEnvironment()
    env.filters.update(_plugin_filters())
    samples = [page({"preemptions": 0}), page({"preemptions": 3})]
    findings = env.from_string("{{ samples | pd_diagnose('decode', cluster) }}").render(
        samples=samples, cluster=CLUSTER)
    assert findings == diagnosis.diagnose(samples, "decode", CLUSTER)
    assert diagnosis.verdict(findings)["status"] == "critical"
    parsed = env.from_string("{{ text | pd_parse_metrics }}").render(text=samples[1])
    assert parsed["num_preemptions"] == 3


# ---- the playbooks against stand-ins on 127.0.0.1 ------------------------------------------------

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def _inventory(tmp_path, p_port, d_port, proxy_port):
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {
        # two simulated machines that share this machine's loopback address (pd_machine says so)
        "children": {"pd_clusters": {"children": {"t1": {"hosts": {"t1-p0": {"pd_machine": "t1-p0"},
                                                                   "t1-d0": {"pd_machine": "t1-d0"}}}}},
                     "prefill": {"hosts": {"t1-p0": None}}, "decode": {"hosts": {"t1-d0": None}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "pd_host_address": "127.0.0.1", "pd_npus": 8, "pd_host_ram": "512GiB", "pd_hccl_if": "lo"}}}))
    raw = {"name": "t1", "vllm_ascend_version": "0.25.1", "image": "quay.io/ascend/vllm-ascend:v0.25.1rc1",
           "model": {"path": "/data/models/DeepSeek-V4-Flash"}, "proxy": {"port": proxy_port},
           "prefill": {"dp": 1, "tp": 8, "port_base": p_port, "kv_port": 28000},
           "decode": {"dp": 1, "tp": 8, "port_base": d_port, "kv_port": 28100}}
    (inv / "group_vars" / "t1.yml").write_text(yaml.safe_dump({"pd_cluster": raw}))
    return inv, raw


def _run(playbook, inventory, tmp_path, *extra, build="build", reports="reports"):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    cmd = [ANSIBLE_PLAYBOOK, os.path.join(REPO, "playbooks", playbook), "-i", str(inventory),
           "-e", f"pd_plan_build_dir={tmp_path / build}", "-e", f"pd_ops_reports_dir={tmp_path / reports}", *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _run_together(*runs):
    """Several independent ``_run(...)`` argument tuples at once (each ansible-playbook is one process
    mostly on one core, so on 2 cores two runs take about the time of one); their results in order.
    Runs that share a reports directory must write different files; each gets a build dir of its own."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = [pool.submit(_run, *args, build=f"build-{i}", **kwargs) for i, (args, kwargs) in enumerate(runs)]
        return [future.result() for future in futures]


@pytest.fixture
def standins():
    servers = {"prefill": StandIn(), "decode": StandIn(), "proxy": StandIn()}
    yield servers
    for server in servers.values():
        server.close()


@pytest.mark.ansible
def test_health_check_playbook_reports_preemptions_and_fails_on_critical_when_asked(tmp_path, standins):
    inv, raw = _inventory(tmp_path, standins["prefill"].port, standins["decode"].port, standins["proxy"].port)
    pages = [page({"preemptions": 0}), page({"preemptions": 3})]
    standins["decode"].reset(pages)
    standins["prefill"].reset([page({"running": 1, "waiting": 2})])
    args = ("-e", "pd_ops_scrape_interval=0", "-e", f"pd_ops_docker_socket={tmp_path / 'no-docker.sock'}")
    # the run with pd_health_fail_on_critical: stand-ins of its own serving the same pages from the first
    # scrape on, an inventory and reports of its own, so it runs at the same time as the first run
    fresh = {"prefill": StandIn([page({"running": 1, "waiting": 2})]), "decode": StandIn(pages), "proxy": StandIn()}
    try:
        inv_fresh, _ = _inventory(tmp_path / "fresh", fresh["prefill"].port, fresh["decode"].port, fresh["proxy"].port)
        done, failed = _run_together(
            (("health_check.yml", inv, tmp_path, *args), {}),
            (("health_check.yml", inv_fresh, tmp_path, *args, "-e", "pd_health_fail_on_critical=true"),
             {"reports": "reports-fresh"}))
    finally:
        for server in fresh.values():
            server.close()
    assert done.returncode == 0, done.stdout + done.stderr
    health = json.loads((tmp_path / "reports" / "t1" / "health.json").read_text())
    seqs = model.normalize("t1", copy.deepcopy(raw))["roles"]["decode"]["engine"]["max_num_seqs"]
    assert health["verdict"]["status"] == "critical"
    preempt = [f for f in health["findings"] if f["signal"] == "vllm:num_preemptions"]
    assert preempt and f"lower decode.engine.max_num_seqs from {seqs} to {seqs * 3 // 4}" in preempt[0]["action"]
    stuck = [f for f in health["findings"] if f["signal"] == "vllm:num_requests_running"]
    assert stuck and "raise prefill.engine.max_num_batched_tokens" not in stuck[0]["action"]  # 32768 already fits
    assert "t1: CRITICAL" in done.stdout
    assert failed.returncode != 0
    assert "Critical findings in t1" in failed.stdout


@pytest.mark.ansible
def test_token_gate_playbook_fails_on_one_changed_token_and_passes_on_equal(tmp_path):
    prompts = ["first prompt", "second prompt", "third prompt"]
    (tmp_path / "prompts.yml").write_text(yaml.safe_dump({"max_tokens": 6, "seed": 0, "prompts": prompts}))
    a, b = StandIn(), StandIn(shift={"second prompt": 2})
    try:
        inv, _ = _inventory(tmp_path, 40011, 40012, a.port)
        common = ("-e", f"pd_gate_prompts_file={tmp_path / 'prompts.yml'}")
        # the compare of A against B and the two records of A at the same time (the records write
        # gate-before/after.json, the compare gate-result.json); the compare of the records after them
        failed, *records = _run_together(
            (("token_gate.yml", inv, tmp_path, *common, "-e", f"pd_gate_a_url=http://127.0.0.1:{a.port}",
              "-e", f"pd_gate_b_url=http://127.0.0.1:{b.port}"), {}),
            *[(("token_gate.yml", inv, tmp_path, *common, "-e", "pd_gate_mode=record", "-e", f"pd_gate_label={label}"), {})
              for label in ("before", "after")])  # default endpoint: the cluster's proxy (here: stand-in A)
        assert failed.returncode != 0
        result = json.loads((tmp_path / "reports" / "t1" / "gate-result.json").read_text())
        words = answer_words("second prompt", 6)
        pos = sum(len(w) + 1 for w in words[:2]) + len(words[2])  # the 'x' appended to the 3rd word
        assert result["passed"] is False
        assert [(m["prompt_index"], m["first_diverging_position"]) for m in result["mismatches"]] == [(1, pos)]
        assert f"prompt 1: first difference at character {pos}" in failed.stdout
        for rec in records:
            assert rec.returncode == 0, rec.stdout + rec.stderr
        cmp_ = _run("token_gate.yml", inv, tmp_path, *common, "-e", "pd_gate_mode=compare",
                    "-e", "pd_gate_before=before", "-e", "pd_gate_after=after")
        assert cmp_.returncode == 0, cmp_.stdout + cmp_.stderr
        record = json.loads((tmp_path / "reports" / "t1" / "gate-before.json").read_text())
        assert record["prompts"] == prompts and len(record["answers"]) == 3
    finally:
        a.close()
        b.close()


@pytest.mark.ansible
def test_capacity_and_monitoring_playbooks_write_their_files(tmp_path):
    inv, raw = _inventory(tmp_path, 40021, 40022, 40023)
    # the first capacity report and the monitoring files at the same time (different files)
    done, mon = _run_together((("capacity_report.yml", inv, tmp_path), {}),
                              (("monitoring.yml", inv, tmp_path, "-e", f"pd_monitoring_dir={tmp_path / 'monitoring'}"), {}))
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "reports" / "t1"
    assert json.loads((out / "capacity.json").read_text())["source"] == "estimate"
    assert "# Capacity of t1 (estimate)" in (out / "capacity.md").read_text()
    ET.fromstring((out / "capacity.svg").read_text())
    boots = [{"max_model_len": L, "log_text": vllm_log(L, FIXED, MARGINAL)} for L in LENGTHS]
    (out / "baseline.json").write_text(json.dumps(baseline.baseline_report(boots, config=raw)))
    again = _run("capacity_report.yml", inv, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((out / "capacity.json").read_text())["source"] == "measured"
    assert mon.returncode == 0, mon.stdout + mon.stderr
    prom = yaml.safe_load((tmp_path / "monitoring" / "prometheus.yml").read_text())
    targets = [t["targets"][0] for t in prom["scrape_configs"][0]["static_configs"]]
    assert sorted(targets) == ["127.0.0.1:40021", "127.0.0.1:40022"]
    dash = json.loads((tmp_path / "monitoring" / "grafana-dashboard.json").read_text())
    assert len(dash["panels"]) == 6


def test_load_script_against_a_stand_in_proxy():
    from ansible_collections.pd.deploy.roles.pd_ops.files import pd_load as load
    proxy = StandIn()
    try:
        out = load.run(load_args(load, proxy.port))
    finally:
        proxy.close()
    assert (out["requests"], out["ok"], out["failed"]) == (6, 6, 0)
    assert out["throughput_tokens_per_s"] > 0 and out["latency_p50_s"] is not None
    assert math.isfinite(out["seconds"])


def load_args(load, port):
    import argparse

    return argparse.Namespace(url=f"http://127.0.0.1:{port}/v1/completions", model="m", requests=6, concurrency=3,
                              max_tokens=4, prompt_tokens=16, timeout=10)
