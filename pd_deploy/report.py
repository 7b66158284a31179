"""Human-readable views of a fleet plan: the failure message and the capacity summary."""

import json

from pd_deploy import sizes
from pd_deploy.containers import host_specs


def plan_failure_message(plan):
    """The validate play's failure text: counts, then every violation on its own line."""
    errors = [v for v in plan["violations"] if v["level"] == "error"]
    warnings = [v for v in plan["violations"] if v["level"] != "error"]
    head = (f"The inventory breaks {len(errors)} rule(s) (and has {len(warnings)} warning(s)); "
            "no host was touched. Fix these and run again:")
    return "\n".join([head] + ["  " + m for m in plan["messages"]])


def _h(n):
    return sizes.to_human(n) if n else "0"


def capacity_markdown(name, summary):
    """One cluster's capacity summary as a Markdown table (configured estimate)."""
    cap = summary.get("capacity") or {}
    lines = [f"## {name} (vllm-ascend {summary.get('vllm_ascend_version')})", "",
             "Configured estimate: HBM x gpu_memory_utilization x kv_cache_share "
             "(run playbooks/baseline.yml for measured bytes per token).", "",
             "| | prefill | decode |", "| --- | --- | --- |"]
    rows = [
        ("instances x DP x TP", lambda e: f"{e['instances']} x {e['dp']} x {e['tp']}"),
        ("engine ranks (containers)", lambda e: str(e["ranks"])),
        ("KV budget per host", lambda e: _h(e["kv_budget_per_host_bytes"])),
        ("KV budget per DP group", lambda e: _h(e["kv_budget_per_dp_group_bytes"])),
        ("max-num-seqs per DP group", lambda e: str(e["max_num_seqs_per_dp_group"])),
        ("max-num-batched-tokens", lambda e: str(e["max_num_batched_tokens"])),
        ("concurrency cap (seqs x DP x instances)", lambda e: str(e["total_concurrency_cap"])),
        ("expected P concurrency per instance",
         lambda e: str(e["expected_concurrency_per_instance"]["concurrency"]) if "expected_concurrency_per_instance" in e else "-"),
        ("recommended batched tokens",
         lambda e: str(e["recommended_batched_tokens"]["recommended"]) if "recommended_batched_tokens" in e else "-"),
        ("offload connector", lambda e: e["offload_connector"]),
        ("offload per host", lambda e: _h(e["offload_host_total_bytes"])),
        ("pinned per container", lambda e: _h(e["pinned_per_container_bytes"])),
        ("shm per container", lambda e: _h(e["shm_per_container_bytes"])),
        ("min RAM headroom (RAM - pinned)", lambda e: _h(min(e["ram_headroom_bytes"].values()))),
    ]
    for label, fn in rows:
        cells = [fn(cap[r]) if r in cap else "-" for r in ("prefill", "decode")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    if summary.get("proxy"):
        lines += ["", f"Proxy: {summary['proxy']['host']}:{summary['proxy']['ports']['http']}"]
    return "\n".join(lines) + "\n"


def capacity_lines(plan):
    """Capacity summaries of every cluster as a list of lines (for ansible's debug output)."""
    out = []
    for name, summary in plan["clusters"].items():
        out.extend(capacity_markdown(name, summary).splitlines())
        out.append("")
    return out


def capacity_files(plan):
    """[{cluster, file, content}] for build/render/<cluster>/capacity.{json,md}."""
    out = []
    for name, summary in plan["clusters"].items():
        body = {"cluster": name, "estimate": "configured", "capacity": summary.get("capacity"),
                "ranks": summary.get("ranks"), "proxy": (summary.get("proxy") or {}).get("name")}
        out.append({"cluster": name, "file": "capacity.json", "content": json.dumps(body, indent=2) + "\n"})
        out.append({"cluster": name, "file": "capacity.md", "content": capacity_markdown(name, summary)})
    return out


def rollout_summary(plan, play_hosts, targets=None, dry_run=False):
    """Lines naming, per cluster touched by the play, each container with its host and port.

    With ``targets`` (pd_rollout_targets) each cluster says whether it was rolled out (with
    ``dry_run``, --check: would be) or found running its launch specs and left as it was.
    """
    out = []
    hosts = set(play_hosts or [])
    changed = set((targets or {}).get("changed") or [])
    pending = {n for names in ((targets or {}).get("pending") or {}).values() for n in names}
    for name, summary in plan["clusters"].items():
        if not hosts.intersection(summary["hosts"]):
            continue
        if targets is None:
            out.append(f"{name}:")
        elif name in changed:
            out.append(f"{name}: would be rolled out (--check: nothing was changed)" if dry_run
                       else f"{name}: rolled out")
        else:
            out.append(f"{name}: unchanged (every container runs its launch spec and answered its health URL)")
        for host in summary["hosts"]:
            for spec in plan["hosts"][host]["specs"]:
                out.append(f"  {spec['name']} on {host} port {spec['ports']['http']}{_started(spec, pending)}")
        proxy = summary.get("proxy")
        if proxy:
            out.append(f"  proxy {proxy['name']} on {proxy['host']} port {proxy['ports']['http']}"
                       f"{_started(proxy, pending)}")
    return out


def _started(spec, pending):
    """Marks a container that was not running its launch spec when the deploy began."""
    return " (new or changed launch spec)" if spec["name"] in pending else ""


def build_files(plan, build_dir, render_specs=False):
    """Every controller file of a plan run as [{path, content}] for the pd_write_files action.

    Always build/plan.json and build/render/<cluster>/capacity.{json,md}; with ``render_specs``
    also one build/render/<host>/<container>.json per launch spec (engine ranks and proxies).
    """
    render = f"{build_dir}/render"
    out = [{"path": f"{build_dir}/plan.json", "content": json.dumps(plan, indent=2, sort_keys=True) + "\n"}]
    out += [{"path": f"{render}/{f['cluster']}/{f['file']}", "content": f["content"]} for f in capacity_files(plan)]
    if render_specs:
        for host, entry in plan["hosts"].items():
            for spec in host_specs(entry):
                out.append({"path": f"{render}/{host}/{spec['name']}.json",
                            "content": json.dumps(spec, indent=2, sort_keys=True) + "\n"})
    return out


FILTERS = {
    "pd_build_files": build_files,
    "pd_rollout_summary": rollout_summary,
    "pd_plan_failure_message": plan_failure_message,
    "pd_capacity_lines": capacity_lines,
    "pd_capacity_files": capacity_files,
}
