# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plan a whole fleet: shape check, normalization, topology, rules, launch specs, capacity.

``plan_fleet(fleet)`` is what ``playbooks/validate.yml`` runs once on the controller. It never
raises for bad inventory content: every problem becomes a violation dict (docs/design.md), all of
them are returned at once, and specs are only rendered for clusters without errors.
"""

from ..rollout.containers import spec_ports
from ..rollout.order import rollout_batches
from ..shared import sizes, text
from ..shared.errors import PdError
from ..validate import guards, inventory, limits, registry, rules, secrets
from ..validate.violation import violation
from . import capacity, launch, model, ports, versions
from .shape import shape_violations

HOST_VARS = inventory.HOST_FACTS
#: Group names every inventory has or pd-deploy gives a meaning: a cluster named like one of them
#: would take in hosts of other clusters (every decode host is in 'decode').
RESERVED_GROUPS = ("all", "ungrouped", "pd_clusters", "prefill", "decode")


def _host_role(host):
    roles = [r for r in model.ROLES if r in host["groups"]]
    if len(roles) != 1:
        found = " and ".join(roles) if roles else "neither"
        return None, violation("error", host["name"], "groups",
                               f"host is in {found} of the 'prefill'/'decode' groups",
                               "put every cluster host in exactly one of the groups 'prefill' and 'decode'")
    return roles[0], None


def _group_hosts(fleet, violations, incomplete):
    """Return {cluster name: (raw pd_cluster, [host record])} in inventory order.

    A cluster host refused for its own facts is left out and its cluster added to ``incomplete``: that
    cluster is not placed (its missing host would only show again as NPUs short, a proxy host gone).
    """
    clusters = {}
    violations.extend(inventory.unknown_keys(
        {h["name"]: h.get("keys") or [] for h in fleet["hosts"]}, inventory.known_variables()))
    claimed = {}
    for host in fleet["hosts"]:
        hv = host.get("vars") or {}
        if text.unsafe(host["name"]):
            violations.append(violation("error", host["name"], "inventory host name",
                                        f"{text.shown(host['name'])} holds {text.shown(''.join(text.unsafe(host['name'])))}, "
                                        "an invisible or control character: it prints like another name and its "
                                        "host_vars file is not the one it seems",
                                        "retype the host name in hosts.yml (and its host_vars file name)"))
            continue
        if host.get("error"):
            violations.append(violation("error", host["name"], "variables", host["error"],
                                        "fix the file named above (YAML indentation, quoting) and run again"))
            continue
        raw = hv.get("pd_cluster")
        if not isinstance(raw, dict):
            violations.append(violation("error", host["name"], "pd_cluster",
                                        "no pd_cluster mapping reaches this host",
                                        "define pd_cluster in group_vars/<cluster>.yml for the host's cluster group"))
            continue
        name = raw.get("name")
        if name in RESERVED_GROUPS:
            violations.append(violation("error", host["name"], "pd_cluster.name",
                                        f"{name!r} names a parent group, not a cluster: every host of that group would "
                                        "join this cluster",
                                        "name the cluster after its own child group of pd_clusters (e.g. cluster_a)"))
            continue
        if name not in host["groups"]:
            violations.append(violation("error", host["name"], "pd_cluster.name",
                                        f"{name!r} is not an inventory group this host belongs to",
                                        "set pd_cluster.name to the cluster's group name in its group_vars file"))
            continue
        claimed[host["name"]] = name
        role, problem = _host_role(host)
        if problem:
            violations.append(problem)
            continue
        unsafe = text.string_violations({k: hv[k] for k in HOST_VARS + inventory.HOST_PATH_VARS + ("ansible_host",)
                                         if k in hv}, host["name"], "")
        if unsafe:
            violations.extend(unsafe)
            continue
        violations.extend(inventory.path_violations(host["name"], hv))  # the plan itself does not need them
        facts = inventory.fact_violations(host["name"], hv)
        host_shape = shape_violations({k: hv[k] for k in HOST_VARS if hv.get(k) is not None},
                                      "host.schema.json", host["name"])
        if facts or host_shape:
            violations.extend(facts + host_shape)
            incomplete.add(name)
            continue
        try:
            record = model.host_record(host["name"], role, hv)
        except PdError as exc:
            violations.append(violation("error", exc.where, exc.field, exc.problem, exc.fix))
            incomplete.add(name)
            continue
        record["allow_idle"] = hv.get("pd_allow_idle_hosts") is True
        record["api_key"] = secrets.host_key_fact(hv.get("pd_api_key"))  # a redaction, never the key
        record["image_pull"], pulls = registry.pull_settings(host["name"], hv)  # policy + login flag, no credential
        violations.extend(pulls)
        clusters.setdefault(name, (raw, []))[1].append(record)
    violations.extend(break_lock_warnings(fleet["hosts"]))
    # a cluster group must hold only its own hosts: a name shared with another group merges clusters
    for host in fleet["hosts"]:
        for group in host["groups"]:
            if group in clusters and claimed.get(host["name"], group) != group:
                violations.append(violation("error", host["name"], "pd_cluster.name",
                                            f"the host is in group {group!r} (a cluster) but belongs to cluster "
                                            f"{claimed[host['name']]!r}: two clusters would share hosts",
                                            f"give cluster {group!r} its own group, holding only its hosts"))
    return clusters


def break_lock_warnings(hosts):
    """pd_deploy_break_lock kept in the inventory (plugins/filter/pd.py marks where), once per file."""
    kept = {}
    for host in hosts:
        mark = (host.get("vars") or {}).get("pd_deploy_break_lock")
        if isinstance(mark, dict):
            kept.setdefault(mark.get("kept_in") or "the inventory", []).append(host["name"])
    return [violation("warning", "inventory", "pd_deploy_break_lock",
                      f"is true in {origin} (hosts {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}): every "
                      "deploy breaks the cluster's deploy lock, so two runs at once are no longer refused",
                      "remove it from the inventory and give -e pd_deploy_break_lock=true to the one run that must break "
                      "a stale lock") for origin, names in kept.items()]


def _kv_figures(cluster, role, hosts, topo):
    """KV budget of a role: per NPU, per DP group (TP NPUs), per instance (x DP) and per host.

    From the model's weights (capacity.cluster_role_kv) when models.yml has them, else the
    article's rule of thumb (HBM x gpu_memory_utilization x 0.6). Always an estimate: the engine's
    start-up log (playbooks/baseline.yml) gives the real figure.
    """
    rcfg = cluster["roles"][role]
    eng = rcfg["engine"]
    est = capacity.cluster_role_kv(cluster, role, hosts)
    npus_used = {h["name"]: sum(len(r["devices"]) for r in topo["hosts"][h["name"]]["ranks"]
                                if r["role"] == role) for h in hosts}
    if est is not None:
        worst = est["hosts"][est["worst"]]
        per_npu = worst["kv_per_npu_bytes"]
        basis = (f"weights: {est['quantization']} {est['family']} "
                 f"(plugins/plugin_utils/data/models.yml), HBM the device exposes x gpu_memory_utilization - weights - reserve")
        extra = {"weights_per_npu_bytes": worst["weights"]["total_bytes"],
                 "reserve_per_npu_bytes": worst["reserve"]["total_bytes"],
                 "usable_per_npu_bytes": worst["usable_per_npu_bytes"],
                 "expert_parallel_size": worst["weights"]["ep_size"],
                 "quantization": est["quantization"], "weights_fit": all(b["fits"] for b in est["hosts"].values())}
        per_host = {n: est["hosts"][n]["kv_per_npu_bytes"] * npus_used[n] for n in npus_used}
    else:
        share = capacity.ARTICLE_KV_SHARE
        util = sizes.check_number(eng["gpu_memory_utilization"], "gpu_memory_utilization", "pd_capacity")
        per_host = {h["name"]: int(h["hbm_per_npu_bytes"] * npus_used[h["name"]] * util * share) for h in hosts}
        per_npu = min(int(h["hbm_per_npu_bytes"] * util * share) for h in hosts)
        basis = (f"article rule of thumb: HBM x gpu_memory_utilization x {share} (no weights data for model "
                 f"family {cluster['model'].get('family')!r} in plugins/plugin_utils/data/models.yml)")
        extra = {"weights_fit": None}
    return dict({
        "kv_estimate_basis": basis,
        "kv_budget_per_npu_bytes": per_npu,
        "kv_budget_per_dp_group_bytes": per_npu * rcfg["tp"],
        "kv_budget_per_instance_bytes": per_npu * rcfg["tp"] * rcfg["dp"],
        "kv_budget_per_host_bytes": max(per_host.values(), default=0),
        "kv_budget_by_host_bytes": per_host,
    }, **extra)


def idle_host_violations(name, topo, proxy):
    """Hosts of a cluster that get no engine rank and do not run the proxy (opt in: pd_allow_idle_hosts)."""
    out = []
    for host, rec in topo["hosts"].items():
        if rec["ranks"] or (proxy and proxy["host"] == host) or rec.get("allow_idle"):
            continue
        out.append(violation("error", f"{name}/{rec['role']}@{host}", "hosts",
                             f"idle host: {host} is in cluster {name} but gets no {rec['role']} rank and no proxy",
                             f"remove it from the cluster, raise {rec['role']}.instances / dp, or set "
                             "pd_allow_idle_hosts: true in its host_vars to keep it as a spare"))
    return out


def capacity_summary(cluster, topo, specs):
    """Per-role KV budget, concurrency and offload figures of one cluster (estimates, not measured)."""
    out = {}
    work = cluster["workload"]
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        eng = rcfg["engine"]
        hosts = [h for h in topo["hosts"].values() if h["role"] == role]
        if not hosts:
            continue
        role_specs = [s for s in specs if s["role"] == role]
        pinned_host = {}
        for spec in role_specs:
            pinned_host[spec["host"]] = pinned_host.get(spec["host"], 0) + spec["pinned_offload_bytes"]
        entry = {
            "instances": rcfg["instances"], "dp": rcfg["dp"], "tp": rcfg["tp"],
            "ranks": len(role_specs),
            "max_num_seqs_per_dp_group": eng["max_num_seqs"],
            "max_num_batched_tokens": eng["max_num_batched_tokens"],
            "total_concurrency_cap": eng["max_num_seqs"] * rcfg["dp"] * rcfg["instances"],
            "offload_connector": rcfg["offload_connector"],
            "offload_per_instance_bytes": rcfg["cpu_offload_bytes"],
            "pinned_per_container_bytes": max((s["pinned_offload_bytes"] for s in role_specs), default=0),
            "shm_per_container_bytes": max((s["shm_size_bytes"] for s in role_specs), default=0),
            "ram_headroom_bytes": {h["name"]: h["ram_bytes"] - pinned_host.get(h["name"], 0) for h in hosts},
            # the article's RAM advice is for what one host pins: the instances' shares on the host
            "ram_guidance_bytes": capacity.ram_guidance(max(pinned_host.values(), default=0)),
        }
        entry.update(_kv_figures(cluster, role, hosts, topo))
        if role == "prefill":
            conc = capacity.expected_p_concurrency(eng["max_num_seqs"], rcfg["dp"], eng["max_num_batched_tokens"],
                                                   work["avg_prompt_tokens"])
            entry["expected_concurrency_per_instance"] = conc
            entry["recommended_batched_tokens"] = capacity.recommend_batched_tokens(
                work["avg_prompt_tokens"], tp=rcfg["tp"])
        out[role] = entry
    return out


def plan_cluster(name, raw, hosts, complete=True):
    """Normalize, place, check and render one cluster. Returns a dict with violations.

    Never raises for inventory content: a PdError of the core becomes a violation of this cluster, and
    any other exception a violation that says it is an internal error (not an aborted plan).
    ``complete=False`` (a host of the cluster was refused for its own facts): only the cluster's own
    values are checked, nothing is placed, so the missing host is reported once, by its fact.
    """
    result = {"name": name, "violations": [], "specs": [], "proxy": None}
    try:
        _plan_cluster(name, raw, hosts, result, complete)
    except PdError as exc:
        where = exc.where if str(exc.where).startswith(name) else f"{name}: {exc.where}"
        result["violations"].append(violation("error", where, exc.field, exc.problem, exc.fix or "fix the value"))
        result["specs"], result["proxy"] = [], None
    except Exception as exc:  # noqa: BLE001 -- fail closed with a readable violation, never a traceback
        result["violations"].append(violation("error", name, "(plan)", f"internal error {type(exc).__name__}: {exc}",
                                              "check the values of this cluster's hosts and pd_cluster; report the "
                                              "inventory to the pd-deploy maintainers"))
        result["specs"], result["proxy"] = [], None
    return result


def _plan_cluster(name, raw, hosts, result, complete=True):
    violations = result["violations"]
    violations.extend(text.string_violations(raw, name, ""))
    violations.extend(shape_violations(raw, "cluster.schema.json", name))
    if violations:
        return
    cluster = model.normalize(name, raw)
    # values no engine would take, on the field written: the cluster stops here, so no rule repeats them
    absurd = limits.cluster_violations(cluster, raw, hosts)
    refused = {v["field"] for v in absurd}
    violations.extend(v for v in guards.cluster_violations(cluster) if not limits.follows_from(v, refused))
    violations.extend(absurd)
    violations.extend(secrets.clear_key_violations(cluster))
    key_redaction, key_problems = secrets.cluster_key(name, hosts)
    violations.extend(key_problems)
    if rules.has_errors(violations) or not complete:
        return
    topo, problems = model.topology(cluster, hosts)
    violations.extend(problems)
    result["cluster"] = cluster
    result["topology"] = topo
    if rules.has_errors(problems):
        return
    try:
        specs = [launch.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
                 for inst in topo["instances"] for rank in inst["ranks"]]
    except PdError:
        # a value the builders cannot render: the rules (rendering on their own) name it as the
        # operator wrote it (decode.cpu_offload, not a connector's cpu_bytes_to_use_per_rank)
        found = rules.check_cluster(cluster, topo)
        if not rules.has_errors(found):
            raise
        violations.extend(found)
        return
    violations.extend(rules.check_cluster(cluster, topo, specs))
    proxy = launch.proxy_spec(cluster, topo)
    for spec in specs + [proxy]:  # docs/guide/inventory.md "Secrets": the key as a redaction, the real value at docker run
        secrets.protect(spec, key_redaction, launch.spec_hash)
    violations.extend(idle_host_violations(name, topo, proxy))
    result["capacity"] = capacity_summary(cluster, topo, specs)
    result["specs"] = specs
    result["proxy"] = proxy


def port_collisions(specs, address_of, machine_of=None):
    """Violations for containers of two different clusters claiming a port on one machine.

    ``machine_of`` maps host names to their machine (``pd_machine``, default the address): host
    networking makes every port the machine's, so two host entries of one machine share them.

    Collisions inside one cluster are rules.rule_ports_unique's; this adds the fleet-wide view
    (clusters sharing hosts or addresses, e.g. several clusters on one test machine).
    """
    seen = {}
    clashes = {}
    for spec in specs:
        address = (machine_of or address_of)[spec["host"]]
        for port in spec_ports(spec):
            other = seen.setdefault((address, port), spec)
            if other["cluster"] != spec["cluster"]:
                clashes.setdefault((spec["name"], other["name"]), (spec, other, address, []))[3].append(port)
    out = []
    for spec, other, address, ports in clashes.values():
        shown = ", ".join(map(str, ports[:6])) + (" ..." if len(ports) > 6 else "")
        out.append(violation("error", f"{spec['cluster']}@{spec['host']}", "ports",
                             f"{spec['name']} and {other['name']} (cluster {other['cluster']}) both use port(s) "
                             f"{shown} on machine {address}",
                             "give the clusters sharing this address distinct port_base / kv_port / dp_rpc_port / "
                             "proxy.port values"))
    return out


def _port_claims(result):
    """Port claims (plugins/plugin_utils/ports.py) of a cluster that rendered; [] for one that did not."""
    if not result["specs"]:
        return []
    try:
        row = versions.version_row(result["cluster"]["vllm_ascend_version"])
        return ports.claims(result["cluster"], result["topology"], row)
    except PdError:
        return []  # the cluster's own rules report it


def plan_fleet(fleet):
    """Plan every cluster of ``fleet`` ({"hosts": [{name, groups, vars}], "limit": [names]|None}).

    Returns {"ok", "violations", "clusters": {name: summary (config: the normalized pd_cluster)},
    "hosts": {name: {cluster, role, specs, proxy, docker_socket, ...}}, "batches": [host counts per
    cluster in play order]}.
    """
    if not isinstance(fleet, dict) or not isinstance(fleet.get("hosts"), list):
        raise PdError("pd_fleet_plan", "fleet", "expected {'hosts': [...]}",
                      "call it through playbooks/validate.yml")
    violations = []
    incomplete = set()
    grouped = _group_hosts(fleet, violations, incomplete)
    if not fleet["hosts"]:
        violations.append(violation("error", "inventory", "pd_clusters",
                                    "the inventory holds no cluster: the group pd_clusters has no hosts",
                                    "name your fleet's inventory with -i (copy inventories/example) and list each "
                                    "cluster as a child group of pd_clusters"))
    plan = {"clusters": {}, "hosts": {}}
    all_specs = []
    window_claims = []
    address_of, machine_of = {}, {}
    for name, (raw, hosts) in grouped.items():
        result = plan_cluster(name, raw, hosts, complete=name not in incomplete)
        violations.extend(result["violations"])
        for host in hosts:
            address_of[host["name"]] = host["address"]
            machine_of[host["name"]] = (host.get("machine"), host["address"])
            plan["hosts"][host["name"]] = {
                "cluster": name, "role": host["role"], "specs": [], "proxy": None,
                "npus": host["npus"], "ram_reserve_bytes": host["ram_reserve_bytes"],
                "hbm_per_npu_bytes": host["hbm_per_npu_bytes"], "npu_chip": host["npu_chip"],
                "model_path": ((result.get("cluster") or {}).get("model") or {}).get("path"),
                "address": host["address"], "docker_socket": host["docker_socket"],
                "image_pull": host["image_pull"],
            }
        for spec in result["specs"]:
            plan["hosts"][spec["host"]]["specs"].append(spec)
        for host in hosts:  # a pull policy cannot pull an image given by its ID
            violations.extend(registry.image_violations(host["name"], host["image_pull"], sorted(
                {s["image"] for s in result["specs"] + [result["proxy"] or {}] if s.get("host") == host["name"]})))
        all_specs.extend(result["specs"])
        window_claims.extend(_port_claims(result))
        if result["proxy"]:
            plan["hosts"][result["proxy"]["host"]]["proxy"] = result["proxy"]
            all_specs.append(result["proxy"])
        plan["clusters"][name] = {
            "hosts": [h["name"] for h in hosts],
            "proxy": result["proxy"],
            "capacity": result.get("capacity"),
            "vllm_ascend_version": (result.get("cluster") or {}).get("vllm_ascend_version"),
            "served_model_name": ((result.get("cluster") or {}).get("model") or {}).get("served_name"),
            "ranks": [s["name"] for s in result["specs"]],
            "instances": proxy_instances(result["specs"], address_of),
            "drain_timeout_s": ((result.get("cluster") or {}).get("proxy") or {}).get("drain_timeout_s", 0),
            # the normalized pd_cluster (defaults merged, sizes in bytes; null when it breaks a rule): what
            # the operations roles and playbooks read instead of normalizing pd_cluster again
            "config": result.get("cluster"),
        }
    violations.extend(port_collisions(all_specs, address_of, ports.port_spaces(
        (name, machine, address) for name, (machine, address) in machine_of.items())))
    violations.extend(inventory.machine_violations(
        [h for _cluster, hosts in grouped.values() for h in hosts], all_specs))
    violations.extend(ports.check(window_claims, across_clusters_only=True))
    violations = once(violations, {h["name"] for h in fleet["hosts"]})
    plan["violations"] = violations
    plan["ok"] = not rules.has_errors(violations)
    plan["batches"] = rollout_batches(fleet.get("limit") or [h["name"] for h in fleet["hosts"]], plan["hosts"])
    plan["messages"] = [rules.format_violation(v) for v in violations]
    return plan


def once(violations, host_names=()):
    """Violations that differ only in where (one problem of many hosts or clusters: a fact missing in
    every host_vars, one group_vars value read by each of its hosts) as one, naming the places."""
    merged = {}
    for v in violations:
        key = (v["level"], v["field"], v["message"], v.get("fix"))
        entry = merged.setdefault(key, dict(v, where=[]))
        if v["where"] not in entry["where"]:
            entry["where"].append(v["where"])
    out = []
    for entry in merged.values():
        places = entry["where"]
        noun = "hosts" if all(p in host_names for p in places) else "places"
        entry["where"] = ", ".join(places) if len(places) <= 3 else \
            f"{', '.join(places[:3])} and {len(places) - 3} other {noun}"
        out.append(entry)
    return out


def proxy_instances(specs, address_of):
    """{role: [{instance, ranks: [{name, host, key}]}]}: each instance's ranks as its proxy lists them
    (key = the host's address:the rank's HTTP port, as launch.proxy_spec writes --*-hosts/--*-ports)."""
    out = {}
    for spec in specs:
        insts = out.setdefault(spec["role"], [])
        if not insts or insts[-1]["instance"] != spec["instance"]:
            insts.append({"instance": spec["instance"], "ranks": []})
        insts[-1]["ranks"].append({"name": spec["name"], "host": spec["host"],
                                   "key": f"{address_of[spec['host']]}:{spec['ports']['http']}"})
    return out


def human(n):
    """Bytes as a short binary size for summaries."""
    return sizes.to_human(n)
