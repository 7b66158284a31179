# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Remove hosts from their clusters (``playbooks/remove_hosts.yml``, docs/guide/scale.md "Remove hosts").

``remove_hosts_plan(plan, hosts)`` reads the validated plan (``pd_plan_fleet``) and the host names the
operator gave, and says what removing them takes: every instance with a rank on one of them (the whole
instance: its ranks on other hosts go too), the backends each cluster's proxy keeps, and the
containers to remove on each host. It refuses, before anything is touched, a removal that would leave a
role (prefill or decode) of a cluster with no instance, or take away the host that runs the cluster's
proxy. Pure: the same input gives the same answer, nothing is kept between calls.
"""

from ..shared.errors import PdError
from ..plan.launch import backends_args

ROLES = ("prefill", "decode")


def _names(hosts):
    """The host names given as a list or as text ``h1,h2`` (spaces allowed); order kept, duplicates dropped."""
    if hosts is None:
        return []
    if isinstance(hosts, str):
        items = hosts.replace(" ", ",").split(",")
    elif isinstance(hosts, (list, tuple)):
        items = hosts
    else:
        raise PdError("pd_remove_hosts_plan", "pd_remove_hosts",
                      f"expected host names (text h1,h2 or a list), got {type(hosts).__name__}",
                      "give -e pd_remove_hosts=host1,host2")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise PdError("pd_remove_hosts_plan", "pd_remove_hosts",
                          f"expected host names, got {item!r} ({type(item).__name__})",
                          "give -e pd_remove_hosts=host1,host2")
        name = item.strip()
        if name and name not in out:
            out.append(name)
    return out


def _rank_key(plan, spec):
    return f"{plan['hosts'][spec['host']]['address']}:{spec['ports']['http']}"


def remove_hosts_plan(plan, hosts):
    """What removing ``hosts`` from their clusters takes; see the module's docstring.

    Returns {"hosts": [names], "problems": [text], "clusters": [{cluster, proxy_host, proxy_name,
    proxy_url, serving_file, docker_socket, want, backends_file, removed: [{role, instance, ranks}],
    remaining: {role: count}, lower: {role: (instances before, after)}}], "containers": {host: [name]},
    "lines": [text]}. ``problems`` not empty: nothing may be touched (each names the cluster, the hosts,
    the role and the fix).
    """
    if not isinstance(plan, dict) or not isinstance(plan.get("hosts"), dict) or not isinstance(plan.get("clusters"), dict):
        raise PdError("pd_remove_hosts_plan", "plan", "expected the validated plan (pd_plan_fleet)",
                      "call it with hostvars['localhost'].pd_plan_fleet, after playbooks/validate.yml")
    names = _names(hosts)
    out = {"hosts": names, "problems": [], "clusters": [], "containers": {}, "lines": []}
    if not names:
        out["problems"].append("pd_remove_hosts: no host given: name the hosts to remove, "
                               "-e pd_remove_hosts=host1,host2")
        return out
    unknown = [n for n in names if n not in plan["hosts"]]
    for name in unknown:
        out["problems"].append(
            f"pd_remove_hosts: {name} is not a host of any cluster of this inventory (cluster hosts: "
            f"{', '.join(sorted(plan['hosts'])) or 'none'}): check the name")
    gone = set(names) - set(unknown)
    touched = []
    for name in names:
        if name in gone and plan["hosts"][name]["cluster"] not in touched:
            touched.append(plan["hosts"][name]["cluster"])
    for cluster in touched:
        _cluster(plan, cluster, gone, out)
    if out["problems"]:
        out["clusters"], out["containers"], out["lines"] = [], {}, []
    return out


def _cluster(plan, cluster, gone, out):
    summary = plan["clusters"][cluster]
    here = [h for h in summary["hosts"] if h in gone]
    proxy = summary.get("proxy")
    if not proxy:
        out["problems"].append(f"{cluster}: the plan has no proxy for this cluster (it breaks a rule): "
                               "run playbooks/validate.yml and fix what it reports first")
        return
    if proxy["host"] in gone:
        out["problems"].append(
            f"{cluster}: {proxy['host']} runs the cluster's proxy {proxy['name']} (pd_cluster.proxy.host): set "
            f"proxy.host to a host that stays and deploy, then remove {', '.join(here)}")
    specs = [s for h in summary["hosts"] for s in plan["hosts"][h]["specs"] if s["cluster"] == cluster]
    removed, kept = [], {}
    config = summary.get("config") or {}
    for role in ROLES:
        instances = sorted({s["instance"] for s in specs if s["role"] == role})
        hit = [i for i in instances if any(s["host"] in gone for s in specs if s["role"] == role and s["instance"] == i)]
        kept[role] = [i for i in instances if i not in hit]
        if instances and not kept[role]:
            role_hosts = sorted({s["host"] for s in specs if s["role"] == role})
            out["problems"].append(
                f"{cluster}: removing {', '.join(here)} would leave {role} with no instance (its "
                f"{len(instances)} instance(s) run on {', '.join(role_hosts)}): keep the hosts of one of them, or add a "
                f"{role} host, raise {role}.instances and deploy before removing them")
        for index in hit:
            ranks = [s for s in specs if s["role"] == role and s["instance"] == index]
            removed.append({"role": role, "instance": index,
                            "ranks": [{"name": s["name"], "host": s["host"], "key": _rank_key(plan, s)} for s in ranks]})
    want = {role: [_rank_key(plan, s) for s in specs if s["role"] == role and s["instance"] in kept[role]]
            for role in ROLES}
    remaining = {role: [{"address": plan["hosts"][s["host"]]["address"], "port": s["ports"]["http"]}
                        for s in specs if s["role"] == role and s["instance"] in kept[role]] for role in ROLES}
    roles_cfg = config.get("roles") or {}
    lower = {role: [len(kept[role]) + len([r for r in removed if r["role"] == role]), len(kept[role])]
             for role in ROLES if any(r["role"] == role for r in removed)}
    entry = {
        "cluster": cluster,
        "hosts": here,
        "proxy_host": proxy["host"],
        "proxy_name": proxy["name"],
        "proxy_url": f"http://127.0.0.1:{proxy['ports']['http']}",
        "serving_file": proxy.get("serving_file", ""),
        "docker_socket": plan["hosts"][proxy["host"]]["docker_socket"],
        "drain_timeout_s": summary.get("drain_timeout_s") or 0,
        "want": want,
        "backends_file": {"path": proxy["backends_file"]["path"], "content": backends_args(remaining)}
        if proxy.get("backends_file") else None,
        "removed": removed,
        "remaining": {role: len(kept[role]) for role in ROLES},
        "lower": lower,
    }
    out["clusters"].append(entry)
    for inst in removed:
        for rank in inst["ranks"]:
            out["containers"].setdefault(rank["host"], []).append(rank["name"])
    for host in here:
        out["containers"].setdefault(host, [])
    renumbered = [role for role in ROLES if kept[role] and kept[role] != list(range(len(kept[role])))]
    dropped = "; ".join(f"{r['role']} instance {r['instance']} ({', '.join(k['name'] for k in r['ranks'])})" for r in removed)
    out["lines"].append(f"{cluster}: drained out of {proxy['name']} and removed: {dropped or 'no rank'}; "
                        f"the proxy serves {', '.join(f'{len(want[r])} {r} rank(s)' for r in ROLES)}")
    fix = [f"{role}.instances: {n[0]} -> {n[1]}" for role, n in lower.items() if roles_cfg.get(role, {}).get("instances", n[0]) == n[0]]
    out["lines"].append(
        f"{cluster}: now delete {', '.join(here)} from the inventory (its groups and host_vars)"
        + (f" and set {', '.join(fix)} in pd_cluster" if fix else "")
        + ": until then a deploy starts the removed instances again"
        + (f"; the next deploy renumbers the remaining {' and '.join(renumbered)} instance(s) (replaced one at a time, drained)"
           if renumbered else ""))
