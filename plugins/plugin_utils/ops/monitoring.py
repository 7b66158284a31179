# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 7, monitoring: a Prometheus scrape configuration and a Grafana dashboard for every rank of a
fleet plan, with a panel per pitfall signal."""

from collections.abc import Mapping

from ..shared.errors import PdError
from .diagnosis import KV_HIGH


def _addresses(plan):
    """{host: address} from the launch specs (HCCL_IF_IP is the host's address)."""
    out = {}
    for host, entry in plan["hosts"].items():
        for spec in entry.get("specs") or []:
            if spec.get("env", {}).get("HCCL_IF_IP"):
                out.setdefault(host, spec["env"]["HCCL_IF_IP"])
    return out


def _check_plan(plan, where):
    if not isinstance(plan, Mapping) or not isinstance(plan.get("clusters"), Mapping) \
            or not isinstance(plan.get("hosts"), Mapping):
        raise PdError(where, "plan", "is not a fleet plan", "pass hostvars['localhost'].pd_plan_fleet")


def prometheus_scrape_config(plan, blackbox="127.0.0.1:9115", scrape_interval="15s", addresses=None):
    """A Prometheus configuration scraping every engine rank of every cluster of ``plan``.

    One job ``pd-<cluster>`` per cluster: targets ``<host address>:<rank port>`` (path /metrics) with
    labels ``cluster``, ``role``, ``instance`` (the container name), ``pd_instance`` (P/D instance
    index), ``dp_rank`` and ``host``. The proxy serves no /metrics, so it is probed: job
    ``pd-<cluster>-proxy`` through a blackbox exporter at ``blackbox`` (module http_2xx on its
    /healthcheck; ``probe_success`` is "proxy up"). ``addresses`` ({host: address}) overrides the
    addresses taken from the specs.
    """
    where = "pd_prometheus_scrape_config"
    _check_plan(plan, where)
    addr = _addresses(plan)
    addr.update(addresses or {})
    jobs = []
    for name in sorted(plan["clusters"]):
        summary = plan["clusters"][name]
        targets = []
        for host in summary["hosts"]:
            for spec in plan["hosts"][host]["specs"]:
                targets.append({"targets": [f"{addr.get(host, host)}:{spec['ports']['http']}"],
                                "labels": {"cluster": name, "role": spec["role"], "instance": spec["name"],
                                           "pd_instance": str(spec["instance"]), "dp_rank": str(spec["dp_rank"]),
                                           "host": host}})
        jobs.append({"job_name": f"pd-{name}", "metrics_path": "/metrics", "scrape_interval": scrape_interval,
                     "static_configs": targets})
        proxy = summary.get("proxy")
        if proxy:
            url = f"http://{addr.get(proxy['host'], proxy['host'])}:{proxy['ports']['http']}/healthcheck"
            jobs.append({
                "job_name": f"pd-{name}-proxy", "metrics_path": "/probe", "scrape_interval": scrape_interval,
                "params": {"module": ["http_2xx"]},
                "static_configs": [{"targets": [url], "labels": {"cluster": name, "role": "proxy",
                                                                 "instance": proxy["name"], "host": proxy["host"]}}],
                "relabel_configs": [{"source_labels": ["__address__"], "target_label": "__param_target"},
                                    {"target_label": "__address__", "replacement": blackbox}],
            })
    return {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": jobs}


def _panel(pid, title, exprs, grid, description, unit=None, thresholds=None, kind="timeseries", extra=None):
    defaults = {"unit": unit} if unit else {}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]
                                  + [{"color": c, "value": v} for v, c in thresholds]}
        if kind == "timeseries":
            defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    panel = {
        "id": pid, "type": kind, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": dict(zip(("x", "y", "w", "h"), grid)),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(exprs)],
    }
    panel.update(extra or {})
    return panel


def grafana_dashboard(plan, kv_high=KV_HIGH):
    """A Grafana dashboard (JSON model) with one panel per signal of the article's pitfall table.

    Panels: requests running, requests waiting, KV cache usage (threshold line at ``kv_high``),
    preemption rate, TTFT p50 / p95 from the histogram, proxy up (blackbox ``probe_success``).
    Variables: ``datasource`` (Prometheus) and ``cluster`` (the plan's clusters).
    """
    where = "pd_grafana_dashboard"
    _check_plan(plan, where)
    sel = 'cluster=~"$cluster"'
    by = "cluster, role, instance"
    up_defaults = {
        "mappings": [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                                   "1": {"text": "UP", "color": "green"}}}],
        "thresholds": {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}]},
    }
    panels = [
        _panel(1, "Requests running", [(f"sum by ({by}) (vllm:num_requests_running{{{sel}}})", "{{instance}}")],
               (0, 0, 12, 8), "Prefill stuck at 1 while requests wait: max-num-batched-tokens < prompt; raise it "
               "to >= 2 x average prompt."),
        _panel(2, "Requests waiting", [(f"sum by ({by}) (vllm:num_requests_waiting{{{sel}}})", "{{instance}}")],
               (12, 0, 12, 8), "Queue per rank; with running stuck at 1 on prefill the token budget is too small."),
        _panel(3, "KV cache usage", [(f"max by ({by}) (vllm:kv_cache_usage_perc{{{sel}}})", "{{instance}}")],
               (0, 8, 12, 8), f"Above {kv_high} sustained: the KV pool is nearly empty; add CPU offload or lower "
               "max-model-len.", unit="percentunit", thresholds=[(kv_high, "red")],
               extra={"options": {"legend": {"displayMode": "list"}}}),
        _panel(4, "Preemptions per second",
               [(f"sum by ({by}) (rate(vllm:num_preemptions_total{{{sel}}}[5m]))", "{{instance}}")],
               (12, 8, 12, 8), "Should stay 0. Above 0 the KV is truly short: lower max-num-seqs on D or add "
               "RecomputeCPUOffloadConnector.", unit="ops", thresholds=[(0.0001, "red")]),
        _panel(5, "Time to first token p50 / p95",
               [(f"histogram_quantile(0.5, sum by (le, cluster, role) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[5m])))", "p50 {{cluster}}/{{role}}"),
                (f"histogram_quantile(0.95, sum by (le, cluster, role) "
                 f"(rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[5m])))", "p95 {{cluster}}/{{role}}")],
               (0, 16, 12, 8), "TTFT growing under steady load: batch too large, requests queue; lower "
               "max-num-batched-tokens.", unit="s"),
        _panel(6, "Proxy up", [(f'max by (cluster) (probe_success{{role="proxy", {sel}}})', "{{cluster}}")],
               (12, 16, 12, 8), "The PD proxy's /healthcheck probed by the blackbox exporter (1 = up).",
               kind="stat", thresholds=[(1, "green")],
               extra={"options": {"colorMode": "background", "reduceOptions": {"calcs": ["lastNotNull"]}},
                      "fieldConfig": {"defaults": up_defaults, "overrides": []}}),
    ]
    clusters = sorted(plan["clusters"])
    return {
        "uid": "pd-deploy-ops", "title": "pd-deploy: PD clusters (pitfall table signals)",
        "tags": ["pd-deploy", "vllm-ascend"], "timezone": "browser", "schemaVersion": 39, "version": 1,
        "editable": True, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "cluster", "type": "custom", "label": "cluster", "multi": True, "includeAll": True,
             "query": ",".join(clusters),
             "current": {"text": "All", "value": "$__all"},
             "options": [{"text": c, "value": c, "selected": False} for c in clusters]},
        ]},
        "panels": panels,
    }
