# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Human-readable views of a fleet plan: the failure message and the capacity summary."""

import json
import os
import re

from ..rollout.containers import PREVIOUS, host_specs, short_id, spec_state
from ..rollout.order import cluster_batch_problem
from ..shared import sizes
from ..shared.errors import PdError
from .refusal import precheck_report, validate_report


def _counts(plan):
    errors = sum(1 for v in plan["violations"] if v["level"] == "error")
    return errors, len(plan["violations"]) - errors


def plan_report(plan):
    """Every violation of a plan, one per line under a count: printed once by the validate play."""
    errors, warnings = _counts(plan)
    if errors:
        head = (f"The inventory breaks {errors} rule(s) (and has {warnings} warning(s)); "
                "no host was touched. Fix these and run again:")
    else:
        head = f"The inventory passes every rule, with {warnings} warning(s):"
    return "\n".join([head] + ["  " + " ".join(m.split()) for m in plan["messages"]])


def plan_failure_message(plan):
    """The validate play's failure text: the counts only. Ansible 2.19 prints a failed task's msg twice
    (its error line and the result), so the violations come once, under it, in the result's
    ``violations`` (pd_plan_check)."""
    errors, warnings = _counts(plan)
    return (f"The inventory breaks {errors} rule(s) (and has {warnings} warning(s)), listed below; "
            "no host was touched.")


def inventory_problem(sources, cluster_hosts, demo, refuse_demo):
    """Why the inventory cannot be planned at all, or "" (checked before anything is written).

    ``sources`` is ``ansible_inventory_sources``, ``cluster_hosts`` the number of hosts of pd_clusters,
    ``demo`` whether its first host has ``pd_inventory_render_only`` (the embedded demo inventory) and
    ``refuse_demo`` whether this run would start containers (not render-only): the demo inventory only
    renders.
    """
    names = ", ".join(str(s) for s in sources or [])
    if not cluster_hosts:
        return (f"The inventory {names} holds no cluster: the group pd_clusters has no hosts. Name your fleet's "
                "inventory with -i inventories/<fleet> (copy inventories/example) and list each cluster as a child "
                "group of pd_clusters.")
    if demo and refuse_demo:
        return (f"{names} is the embedded demo inventory (pd_inventory_render_only): it only renders, it never "
                "starts containers on this controller. Add -e pd_render_only=true to render, or name your fleet's "
                "inventory with -i inventories/<fleet>.")
    return ""


def plan_problem(sources, cluster_hosts, demo=False, refuse_demo=False, cluster_batch=None, parallel_clusters=False):
    """Why validate refuses this run whatever the fleet's rules say, or "": an inventory that cannot be planned
    (``inventory_problem``), else deploy-pd.yml's rollout batch size (``pd_cluster_batch``; None: not given).
    Checked before the plan's rules: pd_plan_check fails with it, and deploy-pd.yml (which goes on past a
    refusal to report it) reads the same text as ``pd_plan_problem`` to touch no host, report it and fail.
    """
    if not isinstance(cluster_hosts, int) or isinstance(cluster_hosts, bool) or cluster_hosts < 0:
        raise PdError("pd_plan_problem", "cluster_hosts", f"{cluster_hosts!r} is not a number of hosts",
                      "pass groups['pd_clusters'] | length")
    for name, flag in (("demo", demo), ("refuse_demo", refuse_demo), ("parallel_clusters", parallel_clusters)):
        if not isinstance(flag, bool):
            raise PdError("pd_plan_problem", name, f"{flag!r} is not a boolean", f"pass {name} | bool")
    problem = inventory_problem(sources, cluster_hosts, demo, refuse_demo)
    if problem or cluster_batch is None:
        return problem
    return cluster_batch_problem(cluster_batch, parallel_clusters)


def inventory_note(sources, cluster_hosts, demo):
    """The line naming the inventory being checked: without -i, ansible.cfg's embedded demo inventory
    is checked, and "ok" would read as the fleet's."""
    names = ", ".join(str(s) for s in sources or [])
    note = (": the embedded demo inventory (the default of ansible.cfg when no -i is given), not a fleet; name "
            "the inventory of your fleet with -i inventories/<fleet>") if demo else ""
    return f"Checking the inventory {names} ({cluster_hosts} cluster host(s)){note}."


def _h(n):
    return sizes.to_human(n) if n else "0"


def _basis(cap):
    bases = sorted({e.get("kv_estimate_basis", "") for e in cap.values()})
    return "; ".join(b for b in bases if b)


def capacity_markdown(name, summary):
    """One cluster's capacity summary as a Markdown table (an estimate until a baseline measures it).

    Every figure says what it is per: per NPU, per DP group (one engine of TP NPUs: max-num-seqs and
    max-num-batched-tokens are per DP group), per instance (DP groups x DP) or per host.
    """
    cap = summary.get("capacity") or {}
    lines = [f"## {name} (vllm-ascend {summary.get('vllm_ascend_version')})", "",
             f"ESTIMATE, not measured: {_basis(cap) or 'no capacity (the cluster failed validation)'}. "
             "Run playbooks/baseline.yml to read the engine's own KV figures.", "",
             "| | prefill | decode |", "| --- | --- | --- |"]

    def opt(key, fn):
        return lambda e: fn(e[key]) if e.get(key) is not None else "-"

    rows = [
        ("instances x DP x TP", lambda e: f"{e['instances']} x {e['dp']} x {e['tp']}"),
        ("engine ranks (containers, one per DP group)", lambda e: str(e["ranks"])),
        ("weights per NPU (estimate)", opt("weights_per_npu_bytes", _h)),
        ("runtime + activation reserve per NPU (estimate)", opt("reserve_per_npu_bytes", _h)),
        ("KV budget per NPU (estimate)", lambda e: _h(e["kv_budget_per_npu_bytes"])),
        ("KV budget per DP group (TP NPUs)", lambda e: _h(e["kv_budget_per_dp_group_bytes"])),
        ("KV budget per instance (DP groups)", lambda e: _h(e["kv_budget_per_instance_bytes"])),
        ("KV budget per host (the role's NPUs on it)", lambda e: _h(e["kv_budget_per_host_bytes"])),
        ("max-num-seqs per DP group", lambda e: str(e["max_num_seqs_per_dp_group"])),
        ("max-num-batched-tokens per DP group", lambda e: str(e["max_num_batched_tokens"])),
        ("concurrency cap (seqs x DP x instances)", lambda e: str(e["total_concurrency_cap"])),
        ("expected P concurrency per DP group / per instance",
         lambda e: (f"{e['expected_concurrency_per_instance']['concurrency_per_dp_group']} / "
                    f"{e['expected_concurrency_per_instance']['concurrency']}")
         if "expected_concurrency_per_instance" in e else "-"),
        ("recommended batched tokens per DP group",
         lambda e: str(e["recommended_batched_tokens"]["recommended"]) if "recommended_batched_tokens" in e else "-"),
        ("offload connector", lambda e: e["offload_connector"]),
        ("offload per instance", lambda e: _h(e["offload_per_instance_bytes"])),
        ("pinned per container", lambda e: _h(e["pinned_per_container_bytes"])),
        ("shm per container", lambda e: _h(e["shm_per_container_bytes"])),
        ("min RAM headroom (RAM - pinned)", lambda e: _h(min(e["ram_headroom_bytes"].values()))),
        ("host RAM the article advises (offload + 312GiB)", opt("ram_guidance_bytes", _h)),
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
    """[{cluster, file, content}] for build/<inventory>/render/<cluster>/capacity.{json,md}."""
    out = []
    for name, summary in plan["clusters"].items():
        body = {"cluster": name, "estimate": "configured (not measured: see kv_estimate_basis)", "capacity": summary.get("capacity"),
                "ranks": summary.get("ranks"), "proxy": (summary.get("proxy") or {}).get("name")}
        out.append({"cluster": name, "file": "capacity.json", "content": json.dumps(body, indent=2) + "\n"})
        out.append({"cluster": name, "file": "capacity.md", "content": capacity_markdown(name, summary)})
    return out


def rollout_summary(plan, play_hosts, targets=None, dry_run=False, outcomes=None, probes=None, prechecks=None,
                    rollout_skipped=False, problem=""):
    """The deploy's closing report: per cluster of the play, what it became and each container's state.

    ``targets`` is the rollout the prechecks decided, order.rollout_targets (None: render-only, the containers are only listed). With it, each
    cluster is rolled out (with ``dry_run``, --check: would be), unchanged, failed during its rollout, or
    not rolled out because the deploy stopped first. ``outcomes`` is {host: pd_rollout_outcome fact} of
    the rolled hosts ({done: true}, or {done: false, task, msg} from the rollout's rescue; missing: the
    host's batch never ended; None: not known, as for a render). When a rolled host did not finish,
    the deploy failed: ``probes`` ({host: pd_host_probe result read after the failure, or an
    unreachable/failed task result}) then tell each
    container's spec as it is now (current / old / not running / missing), the kept previous containers
    left over and the hosts that could not be read. Each container's line ends with the short ID of
    the image it runs (or is started from: ``targets["images"]``; after a failure, as read again), marked
    when its tag names another image now; the WARNING lines of moved tags (``targets["warnings"]``) close
    the report. Returns the report's lines.

    ``prechecks`` ({"probes": {host: the prechecks' pd_host_check result}, "fleet": the play's problems by host
    (pd_prechecks_verdict's fleet_problems), or instead "verdicts": {host: {failed, msg}}}, a host missing or {}
    where it never got there; optionally "pulls": {host: pd_image_pull_result},
    "pings": {host: pd_prechecks_ping_verdict}) is passed when no rollout was decided, or one decided was
    called off by a failed NPU ping (``targets`` is None outside a render): the report then names the failed
    pulls, the problems found, the hosts that could not be read and the NPU ping problems, and every cluster
    as not touched, instead of listing containers nobody looked at.
    A run validate refused (``problem``: ``plan_problem``'s text, pd_plan_problem) or a plan that broke a rule
    (render-only too: no host was contacted, nothing written) gets ``validate_report`` instead.
    ``rollout_skipped``: this run's --tags / --skip-tags left out the rollout (a cluster to change says so).
    """
    if targets is None and (problem or not plan.get("ok", True)):
        return validate_report(plan, problem, play_hosts)
    if targets is None and prechecks is not None:
        return precheck_report(plan, play_hosts, prechecks)
    hosts = set(play_hosts or [])
    failed = failed_hosts(targets, outcomes) if targets is not None and outcomes is not None and not dry_run else []
    locked = locked_clusters(outcomes) if failed else {}
    out = _failure_head(failed, outcomes or {}, locked) if failed else []
    observed = _read_probes(probes or {}) if failed else {}
    changed = set((targets or {}).get("changed") or [])
    for name, summary in plan["clusters"].items():
        if not hosts.intersection(summary["hosts"]):
            continue
        specs = [(host, spec, spec["name"]) for host in summary["hosts"] for spec in plan["hosts"][host]["specs"]]
        if summary.get("proxy"):
            specs.append((summary["proxy"]["host"], summary["proxy"], f"proxy {summary['proxy']['name']}"))
        if failed and name in changed:
            refused = _refused_batch(summary, outcomes or {})
            if name in locked:
                # what runs there is the other run's work, not this deploy's: no container is listed
                out.append(f"{name}: not touched, held by {locked[name]} (its deploy lock, see the message above)")
            elif refused:
                out.append(f"{name}: not touched: the deploy stopped at the deploy lock of "
                           f"{', '.join(sorted(refused))}, held by another run, before this cluster changed")
            else:
                out.extend(_cluster_after_failure(name, summary, specs, failed, outcomes or {}, observed))
            continue
        if failed and targets is not None:
            # the prechecks' reading is old news after a failure (a daemon restart, a lost host): read again
            out.extend(_unchanged_after_failure(name, specs, observed))
            continue
        out.append(_cluster_head(name, targets, changed, dry_run, rollout_skipped))
        reasons = (targets or {}).get("reasons") or {}
        for host, spec, label in specs:
            why = (reasons.get(host) or {}).get(spec["name"])
            out.append(f"  {label} on {host} port {spec['ports']['http']}" + (f": {why}" if why else "")
                       + _image_note(targets, host, spec["name"]))
        if name in changed:
            removed = (targets or {}).get("removed") or {}
            out.extend(f"  {'would remove' if dry_run or rollout_skipped else 'removed'} {c} on {h}: its instance is no longer in the"
                       " inventory (taken out of the proxy first)" for h in summary["hosts"] for c in removed.get(h, []))
    return out + _unreachable_lines(observed) + list((targets or {}).get("warnings") or [])


def _image_note(targets, host, name):
    """`` (image 0123456789ab)`` of a container's line; with the tag's new image when it moved."""
    image_id = (((targets or {}).get("images") or {}).get(host) or {}).get(name)
    if not image_id:
        return ""
    moved = [m for m in (targets or {}).get("moved") or [] if m["host"] == host and m["name"] == name]
    now = f"; its tag now names {short_id(moved[0]['now'])}: see the WARNING below" if moved else ""
    return f" (image {short_id(image_id)}{now})"


def failed_hosts(targets, outcomes):
    """Hosts the rollout was to roll that did not finish it (none when nothing was rolled)."""
    outcomes = outcomes or {}
    return [h for h in (targets or {}).get("hosts") or [] if not (outcomes.get(h) or {}).get("done")]


def _cluster_head(name, targets, changed, dry_run, rollout_skipped=False):
    if targets is None:
        return f"{name}:"
    if name in changed and rollout_skipped:
        return f"{name}: would be rolled out, not rolled: this run's --tags / --skip-tags leave out the rollout"
    if name in changed:
        return f"{name}: would be rolled out (--check: nothing was changed)" if dry_run else f"{name}: rolled out"
    return f"{name}: unchanged (every container runs its launch spec and answered its health URL)"


def locked_clusters(outcomes):
    """{cluster: holder in words} of the deploy locks another run held (pd_rollout_outcome.locked)."""
    out = {}
    for outcome in (outcomes or {}).values():
        locked = (outcome or {}).get("locked") if isinstance(outcome, dict) else None
        if isinstance(locked, dict):
            out.update({str(k): str(v) for k, v in locked.items()})
    return out


def _refused_batch(summary, outcomes):
    """The locked clusters that stopped this cluster's batch before it changed, or {} (its hosts'
    outcomes: a refused lock and nothing else)."""
    mine = [outcomes.get(h) or {} for h in summary["hosts"] if outcomes.get(h)]
    if not mine or any(o.get("done") or not o.get("locked") for o in mine):
        return {}
    return {k: v for o in mine for k, v in o["locked"].items()}


def _refused(failed, outcomes):
    """Whether the deploy stopped only at deploy locks another run holds: every host of the stopped
    batch (those with an outcome; later batches have none) records a refused lock."""
    stopped = [outcomes.get(h) for h in failed if outcomes.get(h)]
    return bool(stopped) and all(isinstance(o, dict) and o.get("locked") for o in stopped)


def failure_message(targets, outcomes):
    """The deploy's closing failure text (deploy-pd.yml's last task), after the report."""
    failed = failed_hosts(targets, outcomes)
    if _refused(failed, outcomes):
        locked = locked_clusters(outcomes)
        return (f"The deploy was refused: the deploy lock of {', '.join(sorted(locked))} is held by another run "
                "(named above); that cluster was not touched by this run. Deploy again once that run has ended "
                "(a lock whose run is gone or cannot be proven alive: -e pd_deploy_break_lock=true).")
    return (f"The rollout stopped on {', '.join(failed)}: the failed task's message is above the report. Fix the "
            "cause and deploy again; the next deploy finishes or rolls back any replacement left half done.")


def _failure_head(failed, outcomes, locked):
    stops = [(h, outcomes[h]) for h in failed if (outcomes.get(h) or {}).get("task")]
    if _refused(failed, outcomes):
        return [f"DEPLOY REFUSED: the deploy lock of {', '.join(sorted(locked))} is held by another run; "
                "nothing of its batch was touched",
                "State of the clusters (read again from their hosts):"]
    if stops:
        host, why = stops[0]
        first = (str(why.get("msg") or "").strip().splitlines() or ["see the failed task above"])[0]
        where = f"on {host} at task \"{why['task']}\": {first}"
    else:
        where = "before its hosts ended their batch (a host was lost or the run was cut short)"
    return [f"DEPLOY FAILED {where}",
            "State of the clusters after the failure (read again from their hosts):"]


def _read_probes(probes):
    """{host: {"containers": {name: container}} or {"error": text}} from the probes read after a failure."""
    out = {}
    for host, res in probes.items():
        if not isinstance(res, dict) or res.get("unreachable") or res.get("failed") or "containers" not in res:
            msg = " ".join(str((res or {}).get("msg") or "no answer").split()) if isinstance(res, dict) else "no answer"
            out[host] = {"error": msg[:300], "unreachable": bool(isinstance(res, dict) and res.get("unreachable"))}
        elif (res.get("docker") or {}).get("ok") is False:
            out[host] = {"error": f"Docker did not answer: {(res['docker'].get('msg') or '')[:300]}", "unreachable": False}
        else:
            out[host] = {"containers": {c["name"]: c for c in res["containers"] if isinstance(c, dict) and "name" in c}}
    return out


def _cluster_after_failure(name, summary, specs, failed, outcomes, observed):
    mine = [h for h in summary["hosts"] if h in failed]
    began = any(outcomes.get(h) for h in summary["hosts"]) or any(
        (observed.get(h) or {}).get("unreachable") for h in mine)
    states = []
    lines = []
    for host, spec, label in specs:
        state = _container_state(spec, observed.get(host))
        states.append(state)
        found = ((observed.get(host) or {}).get("containers") or {}).get(spec["name"]) or {}
        image = f", image {short_id(found['image_id'])}" if found.get("image_id") else ""
        lines.append(f"  {label} on {host} port {spec['ports']['http']}: {state}{image}")
    for host in summary["hosts"]:
        found = (observed.get(host) or {}).get("containers") or {}
        for cname, c in sorted(found.items()):
            # a host's Docker may list other hosts' containers (one daemon behind several test hosts)
            if cname.endswith(PREVIOUS) and c.get("host", "") in ("", host) and c.get("cluster", name) == name:
                run = "RUNNING (it must stay stopped)" if c.get("running") else "stopped"
                lines.append(f"  leftover {cname} on {host}, {run}: a replacement is unfinished; the next deploy"
                             " finishes it or rolls it back to this container")
    current = sum(1 for s in states if s.startswith("current launch spec, running"))
    if not mine:
        head = f"{name}: rolled out before the failure"
    elif began:
        head = f"{name}: FAILED during its rollout ({current} of {len(states)} containers run their current launch spec)"
    else:
        head = (f"{name}: not rolled out: the deploy stopped before this cluster ({current} of {len(states)}"
                " containers run their current launch spec)")
    return [head] + lines


def _unchanged_after_failure(name, specs, observed):
    """A cluster the prechecks found running its launch specs (not rolled), after a failed deploy: what
    its hosts answer now, not what they answered then (a daemon restart stops every container)."""
    states = [(host, spec, label, _container_state(spec, observed.get(host))) for host, spec, label in specs]
    good = [s for s in states if s[3] == "current launch spec, running"]
    if len(good) == len(states):
        return [f"{name}: unchanged (no change to roll; read again after the failure: every container runs its "
                "launch spec)"]
    return ([f"{name}: not rolled out (no change to roll); read again after the failure, {len(good)} of "
             f"{len(states)} containers run their launch spec, the others:"]
            + [f"  {label} on {host} port {spec['ports']['http']}: {state}" for host, spec, label, state in states
               if state != "current launch spec, running"])


def _container_state(spec, seen):
    """One container's state in words, from a host's probe after a failure (containers.spec_state)."""
    if seen is None:
        return "unknown (its host was not read)"
    if "error" in seen:
        return "unknown (its host could not be read)"
    state = spec_state(spec, seen["containers"])
    if state == "absent":
        return "MISSING (no container)"
    found = seen["containers"][spec["name"]]
    run = "running" if found.get("running") else f"NOT running ({found.get('state') or 'stopped'})"
    return f"{'OLD' if state == 'changed' else 'current'} launch spec, {run}"


def _unreachable_lines(observed):
    bad = [(h, o) for h, o in observed.items() if "error" in o]
    return [f"Host {h} could not be read ({'unreachable' if o['unreachable'] else 'probe failed'}: {o['error']}):"
            " its containers are unknown and may still run; bring the host back and deploy again"
            for h, o in bad]


def build_files(plan, build_dir, render_specs=False):
    """Every controller file of a plan run as [{path, content}] for the pd_write_files action.

    Always build/<inventory>/plan.json and build/<inventory>/render/<cluster>/capacity.{json,md}; with ``render_specs``
    also one build/<inventory>/render/<host>/<container>.json per launch spec (engine ranks and proxies).
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


#: inventory file names that stand for their directory (-i inventories/prod/hosts.yml is "prod")
_INVENTORY_FILES = ("hosts", "inventory")
_INVENTORY_EXTS = (".yml", ".yaml", ".ini", ".json", ".cfg", ".toml")
#: build/ names that are not an inventory's (make collection writes build/collection/)
_RESERVED = ("collection",)


def inventory_slug(sources):
    """Directory name under build/ for the output of one inventory (``ansible_inventory_sources``).

    ``/etc/pd/prod`` and ``/etc/pd/prod/hosts.yml`` are ``prod``; ``inventories/example`` is
    ``example``; a host list (``a,b,``) is ``adhoc``; several sources are joined with ``+``. Only
    ``[A-Za-z0-9._-]`` is kept (others become ``_``), so the name is one safe path segment; an
    inventory named ``collection`` is ``collection-inventory`` (``make collection`` owns that name). Two
    inventories with the same name at different paths get the same slug: pd_write_files' manifest
    records the sources and refuses to mix them.
    """
    if isinstance(sources, str):
        sources = [sources]
    names = []
    for source in sources or []:
        text = str(source).rstrip("/")
        if "," in text and "/" not in text:
            names.append("adhoc")
            continue
        base = os.path.basename(text)
        stem, ext = os.path.splitext(base)
        if ext.lower() in _INVENTORY_EXTS:
            base = stem
        if base.lower() in _INVENTORY_FILES and os.path.basename(os.path.dirname(text)):
            base = os.path.basename(os.path.dirname(text))
        names.append(re.sub(r"[^A-Za-z0-9._-]", "_", base).strip(".") or "inventory")
    slug = "+".join(names) or "default"
    return f"{slug}-inventory" if slug in _RESERVED else slug
