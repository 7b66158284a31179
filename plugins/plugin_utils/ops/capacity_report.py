# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 6, the capacity report: KV budget against what the configured concurrency needs, from the
baseline's fit or the model's configured estimate (``capacity_report``, ``capacity_chart_svg``)."""

import json
import os
from collections.abc import Mapping
from xml.sax.saxutils import escape

from ..plan import capacity, model
from ..shared.errors import PdError
from . import common
from .common import model_estimate

GIB = 1024 ** 3


def _bytes_model(baseline, role, family):
    """(marginal, fixed, source, measured) for a role: the baseline's fit, else models.yml's estimate."""
    fits = (baseline or {}).get("fits") or {}
    entry = fits.get(role) or fits.get("all")
    if entry and entry.get("fit"):
        fit = entry["fit"]
        return (fit["marginal_bytes_per_token"], fit["fixed_bytes_per_request"],
                "measured: playbooks/baseline.yml two-point fit", True)
    est = model_estimate(family)
    return (est["marginal_bytes_per_token"], est["fixed_bytes_per_request"],
            f"configured estimate: plugins/plugin_utils/data/models.yml ({est['source']})", False)


def capacity_report(summary, baseline=None, config=None):
    """Capacity of one cluster: KV budget, tokens and requests that fit, P and D concurrency, offload.

    ``summary``: the cluster's entry of the fleet plan (``plan.clusters[<name>]``, with ``capacity``);
    ``baseline``: a ``baseline_report`` (its fit is used when present, else the configured estimate
    of plugins/plugin_utils/data/models.yml, and the report says which); ``config``: the cluster's ``pd_cluster``
    (workload and engine values; the defaults' workload without it).

    Per role: KV budget per host / per DP group / per worker (group / TP), the footprint of a P99
    request (D: prompt + output; P: prompt), requests and tokens that fit one DP group, and:
    prefill: expected concurrency at the configured and the recommended max-num-batched-tokens;
    decode: memory at the configured concurrency (max_num_seqs x DP x footprint at P99) against the
    budget, and the max_num_seqs that fits. Offload pool, shm and RAM headroom per role.
    Returns a dict with ``markdown``.
    """
    where = "pd_capacity_report"
    if not isinstance(summary, Mapping) or not isinstance(summary.get("capacity"), Mapping):
        raise PdError(where, "summary", "has no capacity (the cluster failed validation?)",
                      "pass hostvars['localhost'].pd_plan_fleet.clusters[<cluster>] of a valid plan")
    cluster = common.normalized(config, where) if config is not None else None
    if cluster is not None:
        work, family, name = cluster["workload"], cluster["model"]["family"], cluster["name"]
    else:
        base = model.defaults()["cluster"]
        work, family = base["workload"], base["model"]["family"]
        name = (summary.get("proxy") or {}).get("cluster") or "cluster"
    p99_prompt = work["p99_prompt_tokens"]
    p99_total = work["p99_prompt_tokens"] + work["p99_output_tokens"]
    roles, measured_any = {}, False
    for role, cap in summary["capacity"].items():
        marginal, fixed, source, measured = _bytes_model(baseline, role, family)
        measured_any = measured_any or measured
        length = p99_total if role == "decode" else p99_prompt
        footprint = fixed + marginal * length
        per_worker = cap["kv_budget_per_dp_group_bytes"] // cap["tp"]
        fit_requests = int(per_worker // footprint) if footprint else 0
        entry = {
            "instances": cap["instances"], "dp": cap["dp"], "tp": cap["tp"],
            "kv_budget_per_host_bytes": cap["kv_budget_per_host_bytes"],
            "kv_budget_per_dp_group_bytes": cap["kv_budget_per_dp_group_bytes"],
            "kv_budget_per_worker_bytes": per_worker,
            "bytes_model": {"marginal_bytes_per_token": marginal, "fixed_bytes_per_request": fixed,
                            "source": source, "measured": measured},
            "p99_length": length,
            "footprint_at_p99_bytes": int(round(footprint)),
            "tokens_fit_per_dp_group_marginal_only": int(per_worker // marginal) if marginal else None,
            "requests_fit_per_dp_group_at_p99": fit_requests,
            "tokens_fit_per_dp_group_at_p99": fit_requests * length,
            "max_num_seqs_per_dp_group": cap["max_num_seqs_per_dp_group"],
            "max_num_batched_tokens": cap["max_num_batched_tokens"],
            "offload_connector": cap["offload_connector"],
            "offload_per_instance_bytes": cap["offload_per_instance_bytes"],
            "pinned_per_container_bytes": cap["pinned_per_container_bytes"],
            "shm_per_container_bytes": cap["shm_per_container_bytes"],
            "ram_headroom_bytes": dict(cap["ram_headroom_bytes"]),
            "min_ram_headroom_bytes": min(cap["ram_headroom_bytes"].values()) if cap["ram_headroom_bytes"] else None,
        }
        notes = (_prefill_concurrency(entry, cap, work) if role == "prefill"
                 else _decode_memory(entry, cap, footprint, fit_requests, length))
        if not measured:
            notes.append("estimate: the fixed per-request KV cost is unknown until playbooks/baseline.yml measures it")
        entry["notes"] = notes
        roles[role] = entry
    report = {"cluster": name, "source": "measured" if measured_any else "estimate", "workload": dict(work),
              "family": family, "roles": roles}
    report["markdown"] = _capacity_markdown(report)
    return report


def _capacity_markdown(report):
    roles = report["roles"]
    cols = [r for r in model.ROLES if r in roles]
    lines = [f"# Capacity of {report['cluster']} ({report['source']})", ""]
    for role in cols:
        lines.append(f"- {role}: bytes per token from {roles[role]['bytes_model']['source']}")
    lines += ["", "| | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]

    def row(label, fn):
        lines.append(f"| {label} | " + " | ".join(fn(roles[r]) for r in cols) + " |")

    row("instances x DP x TP", lambda e: f"{e['instances']} x {e['dp']} x {e['tp']}")
    row("KV budget per host", lambda e: common.human(e["kv_budget_per_host_bytes"]))
    row("KV budget per DP group", lambda e: common.human(e["kv_budget_per_dp_group_bytes"]))
    row("KV budget per worker (NPU)", lambda e: common.human(e["kv_budget_per_worker_bytes"]))
    row("marginal bytes/token per worker", lambda e: f"{e['bytes_model']['marginal_bytes_per_token']:.0f}")
    row("fixed bytes per request", lambda e: common.human(e["bytes_model"]["fixed_bytes_per_request"]))
    row("P99 length (D: prompt+output)", lambda e: str(e["p99_length"]))
    row("footprint of a P99 request per worker", lambda e: common.human(e["footprint_at_p99_bytes"]))
    row("tokens per DP group (marginal only)", lambda e: f"{e['tokens_fit_per_dp_group_marginal_only']:,}")
    row("P99 requests that fit a DP group", lambda e: str(e["requests_fit_per_dp_group_at_p99"]))
    row("max-num-seqs per DP group", lambda e: str(e["max_num_seqs_per_dp_group"]))
    row("max-num-batched-tokens per DP group", lambda e: str(e["max_num_batched_tokens"]))
    row("P concurrency per instance: configured / recommended batched tokens",
        lambda e: (f"{e['expected_concurrency']['configured']['concurrency']} / "
                   f"{e['expected_concurrency']['recommended']['concurrency']} "
                   f"(at {e['expected_concurrency']['recommended_batched_tokens']['recommended']})")
        if "expected_concurrency" in e else "-")
    row("D memory at configured concurrency (instance)",
        lambda e: (f"{common.human(e['memory_at_configured_concurrency']['per_instance_bytes'])} of "
                   f"{common.human(e['memory_at_configured_concurrency']['budget_per_instance_bytes'])} "
                   f"({e['memory_at_configured_concurrency']['share_of_budget']:.0%})")
        if "memory_at_configured_concurrency" in e else "-")
    row("offload connector", lambda e: e["offload_connector"])
    row("offload pool per instance", lambda e: common.human(e["offload_per_instance_bytes"]))
    row("pinned / shm per container", lambda e: f"{common.human(e['pinned_per_container_bytes'])} / {common.human(e['shm_per_container_bytes'])}")
    row("min RAM headroom (RAM - pinned)", lambda e: common.human(e["min_ram_headroom_bytes"]))
    notes = [f"- {role}: {n}" for role in cols for n in roles[role]["notes"]]
    if notes:
        lines += ["", "Notes:", ""] + notes
    return "\n".join(lines) + "\n"


def capacity_chart_svg(report):
    """A small self-contained SVG bar chart of a ``capacity_report`` (no external resources).

    Per role, in GiB per DP group: the KV budget, the KV needed at the configured concurrency with P99
    requests (max_num_seqs x footprint x TP), and the pinned offload per container.
    """
    if not isinstance(report, Mapping) or not isinstance(report.get("roles"), Mapping):
        raise PdError("pd_capacity_chart_svg", "report", "is not a capacity report", "pass pd_capacity_report's result")
    bars = []
    for role in [r for r in model.ROLES if r in report["roles"]]:
        e = report["roles"][role]
        need = e["max_num_seqs_per_dp_group"] * e["footprint_at_p99_bytes"] * e["tp"]
        bars += [(f"{role}: KV budget per DP group", e["kv_budget_per_dp_group_bytes"], "#4e79a7"),
                 (f"{role}: KV for max-num-seqs x P99 request", need, "#e15759" if need > e["kv_budget_per_dp_group_bytes"]
                  else "#59a14f"),
                 (f"{role}: pinned CPU offload per container", e["pinned_per_container_bytes"], "#f28e2b")]
    width, left, right, bar_h, gap, top = 760, 300, 110, 22, 10, 44
    height = top + len(bars) * (bar_h + gap) + 20
    scale = max([v for _label, v, _color in bars] + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<title>{escape("KV capacity of " + str(report["cluster"]))}</title>',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="10" y="22" font-size="15" font-weight="bold">'
             f'{escape("KV capacity of " + str(report["cluster"]) + " (" + report["source"] + ", GiB)")}</text>']
    for i, (label, value, colour) in enumerate(bars):
        y = top + i * (bar_h + gap)
        length = (width - left - right) * value / scale
        parts.append(f'<text x="{left - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(label)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar_h}" fill="{colour}"/>')
        parts.append(f'<text x="{left + length + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{value / GIB:.1f}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _prefill_concurrency(entry, cap, work):
    """P: expected concurrency at the configured and the recommended max-num-batched-tokens (into
    ``entry``); returns the notes."""
    avg = work["avg_prompt_tokens"]
    rec = capacity.recommend_batched_tokens(avg, tp=cap["tp"])
    configured = capacity.expected_p_concurrency(cap["max_num_seqs_per_dp_group"], cap["dp"],
                                                 cap["max_num_batched_tokens"], avg)
    recommended = capacity.expected_p_concurrency(cap["max_num_seqs_per_dp_group"], cap["dp"],
                                                  rec["recommended"], avg)
    entry["expected_concurrency"] = {"configured": configured, "recommended": recommended,
                                     "recommended_batched_tokens": rec}
    return [f"warning: {configured['message']}"] if configured["level"] != "ok" else []


def _decode_memory(entry, cap, footprint, fit_requests, length):
    """D: KV memory at the configured concurrency against the budget (into ``entry``); returns the
    notes."""
    seqs = cap["max_num_seqs_per_dp_group"]
    need_group = seqs * footprint * cap["tp"]
    entry["memory_at_configured_concurrency"] = {
        "per_dp_group_bytes": int(round(need_group)),
        "per_instance_bytes": int(round(need_group * cap["dp"])),
        "budget_per_instance_bytes": cap["kv_budget_per_dp_group_bytes"] * cap["dp"],
        "share_of_budget": need_group / cap["kv_budget_per_dp_group_bytes"],
        "max_num_seqs_that_fit": fit_requests,
    }
    if seqs > fit_requests:
        return [f"warning: max_num_seqs {seqs} per DP group x a P99 request ({length} tokens) needs "
                f"{common.human(need_group)} of {common.human(cap['kv_budget_per_dp_group_bytes'])}: expect preemptions at "
                f"full load; {fit_requests} fit (or add decode offload / lower max_model_len)"]
    return []


def capacity_reports(plan, clusters, configs=None, baselines=None):
    """``capacity_report`` of each of ``clusters`` at once: {cluster: report}.

    ``plan``: the fleet plan; ``configs``: {cluster: pd_cluster}; ``baselines``: {path: JSON text} of
    the ``<reports dir>/<cluster>/baseline.json`` files found (the directory names the cluster; a
    cluster without one gets the configured estimate). capacity_report.yml computes every cluster in
    this one call on the controller instead of a task per cluster.
    """
    where = "pd_capacity_reports"
    if not isinstance(plan, Mapping) or not isinstance(plan.get("clusters"), Mapping):
        raise PdError(where, "plan", "is not a fleet plan", "pass hostvars['localhost'].pd_plan_fleet")
    measured = {}
    for path, text in (baselines or {}).items():
        cluster = os.path.basename(os.path.dirname(str(path)))
        try:
            measured[cluster] = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise PdError(where, str(path), f"is not JSON ({exc})",
                          "run playbooks/baseline.yml again or remove the file") from exc
    out = {}
    for cluster in clusters:
        if cluster not in plan["clusters"]:
            raise PdError(where, "clusters", f"{cluster!r} is not a cluster of the plan", "pass names of plan.clusters")
        out[cluster] = capacity_report(plan["clusters"][cluster], measured.get(cluster), (configs or {}).get(cluster))
    return out


def capacity_report_files(reports, reports_dir):
    """[{path, content}] of ``<reports_dir>/<cluster>/capacity.{json,md,svg}`` for pd_write_files."""
    out = []
    for cluster, report in reports.items():
        body = {k: v for k, v in report.items() if k != "markdown"}
        base = f"{reports_dir}/{cluster}"
        out += [{"path": f"{base}/capacity.json", "content": json.dumps(body, indent=2, sort_keys=True) + "\n"},
                {"path": f"{base}/capacity.md", "content": report["markdown"]},
                {"path": f"{base}/capacity.svg", "content": capacity_chart_svg(report)}]
    return out
