"""Plan a whole fleet: shape check, normalization, topology, rules, launch specs, capacity.

``plan_fleet(fleet)`` is what ``playbooks/validate.yml`` runs once on the controller. It never
raises for bad inventory content: every problem becomes a violation dict (docs/design.md), all of
them are returned at once, and specs are only rendered for clusters without errors.
"""


import jsonschema

from pd_deploy import capacity, datafiles, model, rules, sizes
from pd_deploy.containers import containers_to_start, host_specs, spec_ports
from pd_deploy.errors import PdError

HOST_VARS = ("pd_host_address", "pd_npus", "pd_npu_first", "pd_hbm_per_npu", "pd_host_ram",
             "pd_host_ram_reserve", "pd_hccl_if", "pd_ascend_root")


def schema(name):
    """A fresh copy of ``schemas/<name>``."""
    return datafiles.schema(name)


def _v(level, where, field, message, fix):
    return {"level": level, "where": where, "field": field, "message": message, "fix": fix}


def shape_violations(instance, schema_name, where, prefix=""):
    """Every JSON Schema error of ``instance`` as a violation, with a dotted field path."""
    validator = jsonschema.Draft202012Validator(schema(schema_name))
    out = []
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            # one violation per unknown key, named by its full path (prefill.engine.blok_size)
            known = (err.schema or {}).get("properties") or {}
            for key in [k for k in err.instance if k not in known]:
                field = ".".join(str(p) for p in (prefix, path, key) if p)
                out.append(_v("error", where, field, f"unknown key {key!r}",
                              "remove or rename the key (see inventories/example for the accepted keys)"))
            continue
        field = ".".join(p for p in (prefix, path) if p) or prefix or "(top level)"
        if err.validator == "required":
            missing = [k for k in err.validator_value if k not in (err.instance or {})]
            field = ".".join(p for p in (prefix, path, missing[0] if missing else "") if p)
            fix = f"add the key {missing[0] if missing else ''} (see inventories/example)"
        else:
            fix = f"see schemas/{schema_name} for the accepted values"
        out.append(_v("error", where, field, err.message, fix))
    return out


def _host_role(host):
    roles = [r for r in model.ROLES if r in host["groups"]]
    if len(roles) != 1:
        found = " and ".join(roles) if roles else "neither"
        return None, _v("error", host["name"], "groups",
                        f"host is in {found} of the 'prefill'/'decode' groups",
                        "put every cluster host in exactly one of the groups 'prefill' and 'decode'")
    return roles[0], None


def _group_hosts(fleet, violations):
    """Return {cluster name: (raw pd_cluster, [host record])} in inventory order."""
    clusters = {}
    for host in fleet["hosts"]:
        hv = host.get("vars") or {}
        raw = hv.get("pd_cluster")
        if not isinstance(raw, dict):
            violations.append(_v("error", host["name"], "pd_cluster",
                                 "no pd_cluster mapping reaches this host",
                                 "define pd_cluster in group_vars/<cluster>.yml for the host's cluster group"))
            continue
        name = raw.get("name")
        if name not in host["groups"]:
            violations.append(_v("error", host["name"], "pd_cluster.name",
                                 f"{name!r} is not an inventory group this host belongs to",
                                 "set pd_cluster.name to the cluster's group name in its group_vars file"))
            continue
        role, problem = _host_role(host)
        if problem:
            violations.append(problem)
            continue
        host_shape = shape_violations({k: hv[k] for k in HOST_VARS if hv.get(k) is not None},
                                      "host.schema.json", host["name"])
        if host_shape:
            violations.extend(host_shape)
            continue
        try:
            record = model.host_record(host["name"], role, hv)
        except PdError as exc:
            violations.append(_v("error", exc.where, exc.field, exc.problem, exc.fix))
            continue
        clusters.setdefault(name, (raw, []))[1].append(record)
    return clusters


def capacity_summary(cluster, topo, specs):
    """Per-role KV budget, concurrency and offload figures of one cluster (configured estimate)."""
    out = {}
    work = cluster["workload"]
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        eng = rcfg["engine"]
        hosts = [h for h in topo["hosts"].values() if h["role"] == role]
        if not hosts:
            continue
        first = hosts[0]
        budget = capacity.kv_budget(first["hbm_per_npu_bytes"], first["npus"], eng["gpu_memory_utilization"],
                                    kv_share=eng["kv_cache_share"], dp=max(1, first["npus"] // rcfg["tp"]))
        role_specs = [s for s in specs if s["role"] == role]
        pinned_host = {}
        for spec in role_specs:
            pinned_host[spec["host"]] = pinned_host.get(spec["host"], 0) + spec["pinned_offload_bytes"]
        entry = {
            "instances": rcfg["instances"], "dp": rcfg["dp"], "tp": rcfg["tp"],
            "ranks": len(role_specs),
            "kv_budget_per_host_bytes": budget["host_bytes"],
            "kv_budget_per_dp_group_bytes": budget["per_dp_group_bytes"],
            "max_num_seqs_per_dp_group": eng["max_num_seqs"],
            "max_num_batched_tokens": eng["max_num_batched_tokens"],
            "total_concurrency_cap": eng["max_num_seqs"] * rcfg["dp"] * rcfg["instances"],
            "offload_connector": rcfg["offload_connector"],
            "offload_host_total_bytes": rcfg["cpu_offload_bytes"],
            "pinned_per_container_bytes": max((s["pinned_offload_bytes"] for s in role_specs), default=0),
            "shm_per_container_bytes": max((s["shm_size_bytes"] for s in role_specs), default=0),
            "ram_headroom_bytes": {h["name"]: h["ram_bytes"] - pinned_host.get(h["name"], 0) for h in hosts},
        }
        if role == "prefill":
            conc = capacity.expected_p_concurrency(eng["max_num_seqs"], rcfg["dp"], eng["max_num_batched_tokens"],
                                                   work["avg_prompt_tokens"])
            entry["expected_concurrency_per_instance"] = conc
            entry["recommended_batched_tokens"] = capacity.recommend_batched_tokens(
                work["avg_prompt_tokens"], tp=rcfg["tp"])
        out[role] = entry
    return out


def plan_cluster(name, raw, hosts):
    """Normalize, place, check and render one cluster. Returns a dict with violations."""
    where = name
    violations = shape_violations(raw, "cluster.schema.json", where)
    result = {"name": name, "violations": violations, "specs": [], "proxy": None}
    if violations:
        return result
    try:
        cluster = model.normalize(name, raw)
    except PdError as exc:
        violations.append(_v("error", exc.where, exc.field, exc.problem, exc.fix))
        return result
    topo, problems = model.topology(cluster, hosts)
    violations.extend(problems)
    result["cluster"] = cluster
    result["topology"] = topo
    if rules.has_errors(problems):
        return result
    try:
        specs = [model.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
                 for inst in topo["instances"] for rank in inst["ranks"]]
        violations.extend(rules.check_cluster(cluster, topo, specs))
        proxy = model.proxy_spec(cluster, topo)
    except PdError as exc:
        violations.append(_v("error", exc.where, exc.field, exc.problem, exc.fix))
        return result
    result["specs"] = specs
    result["proxy"] = proxy
    result["capacity"] = capacity_summary(cluster, topo, specs)
    return result


def port_collisions(specs, address_of):
    """Violations for containers of two different clusters claiming a port on one host address.

    Collisions inside one cluster are rules.rule_ports_unique's; this adds the fleet-wide view
    (clusters sharing hosts or addresses, e.g. several clusters on one test machine).
    """
    seen = {}
    clashes = {}
    for spec in specs:
        address = address_of[spec["host"]]
        for port in spec_ports(spec):
            other = seen.setdefault((address, port), spec)
            if other["cluster"] != spec["cluster"]:
                clashes.setdefault((spec["name"], other["name"]), (spec, other, address, []))[3].append(port)
    out = []
    for spec, other, address, ports in clashes.values():
        shown = ", ".join(map(str, ports[:6])) + (" ..." if len(ports) > 6 else "")
        out.append(_v("error", f"{spec['cluster']}@{spec['host']}", "ports",
                      f"{spec['name']} and {other['name']} (cluster {other['cluster']}) both use port(s) "
                      f"{shown} on address {address}",
                      "give the clusters sharing this address distinct port_base / kv_port / dp_rpc_port / "
                      "proxy.port values"))
    return out


def plan_fleet(fleet):
    """Plan every cluster of ``fleet`` ({"hosts": [{name, groups, vars}], "limit": [names]|None}).

    Returns {"ok", "violations", "clusters": {name: summary}, "hosts": {name: {cluster, role,
    specs, proxy}}, "batches": [host counts per cluster in play order]}.
    """
    if not isinstance(fleet, dict) or not isinstance(fleet.get("hosts"), list):
        raise PdError("pd_fleet_plan", "fleet", "expected {'hosts': [...]}",
                      "call it through playbooks/validate.yml")
    violations = []
    grouped = _group_hosts(fleet, violations)
    if not fleet["hosts"]:
        violations.append(_v("error", "inventory", "pd_clusters", "the group pd_clusters has no hosts",
                             "copy inventories/example and list your hosts under pd_clusters"))
    plan = {"clusters": {}, "hosts": {}}
    all_specs = []
    address_of = {}
    for name, (raw, hosts) in grouped.items():
        result = plan_cluster(name, raw, hosts)
        violations.extend(result["violations"])
        for host in hosts:
            address_of[host["name"]] = host["address"]
            plan["hosts"][host["name"]] = {
                "cluster": name, "role": host["role"], "specs": [], "proxy": None,
                "npus": host["npus"], "ram_reserve_bytes": host["ram_reserve_bytes"],
                "model_path": ((result.get("cluster") or {}).get("model") or {}).get("path"),
            }
        for spec in result["specs"]:
            plan["hosts"][spec["host"]]["specs"].append(spec)
        all_specs.extend(result["specs"])
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
        }
    violations.extend(port_collisions(all_specs, address_of))
    plan["violations"] = violations
    plan["ok"] = not rules.has_errors(violations)
    plan["batches"] = rollout_batches(fleet.get("limit") or [h["name"] for h in fleet["hosts"]], plan["hosts"])
    plan["messages"] = [rules.format_violation(v) for v in violations]
    return plan


def rollout_batches(play_hosts, hosts):
    """Sizes of consecutive same-cluster runs of ``play_hosts``: the play's ``serial`` list."""
    batches = []
    last = object()
    for name in play_hosts:
        cluster = (hosts.get(name) or {}).get("cluster")
        if cluster == last:
            batches[-1] += 1
        else:
            batches.append(1)
            last = cluster
    return batches or [1]


def rollout_targets(plan, probes, play_hosts):
    """Which clusters a deploy must roll, from what pd_host_probe found on every host of the play.

    A cluster is rolled when any of its containers (engine ranks, proxy) on a host of the play is not
    running its current launch spec; the others were only probed (health) and are left as they are.
    ``probes`` is {host: pd_host_probe result}. Returns {"hosts": [hosts of the clusters to roll, in
    play order], "batches": the play's serial list for them, "changed": [clusters], "unchanged":
    [clusters], "pending": {host: [container names not running their spec]}}.
    """
    if not isinstance(probes, dict):
        raise PdError("pd_rollout_targets", "probes", "expected {host: pd_host_probe result}",
                      "pass the registered probe of every play host (roles/pd_prechecks)")
    pending = {}
    touched = []
    for host in play_hosts:
        entry = plan["hosts"].get(host)
        if entry is None:
            continue
        if entry["cluster"] not in touched:
            touched.append(entry["cluster"])
        probe = probes.get(host)
        if not isinstance(probe, dict) or "containers" not in probe:
            raise PdError("pd_rollout_targets", f"probes.{host}", "this host was not probed",
                          "run roles/pd_prechecks on every host of the play before the rollout")
        names = [s["name"] for s in containers_to_start(host_specs(entry), probe["containers"])]
        if names:
            pending[host] = names
    changed = [c for c in touched if any(plan["hosts"][h]["cluster"] == c for h in pending)]
    hosts = [h for h in play_hosts if h in plan["hosts"] and plan["hosts"][h]["cluster"] in changed]
    return {"hosts": hosts, "batches": rollout_batches(hosts, plan["hosts"]) if hosts else [1],
            "changed": changed, "unchanged": [c for c in touched if c not in changed], "pending": pending}


def human(n):
    """Bytes as a short binary size for summaries."""
    return sizes.to_human(n)


FILTERS = {
    "pd_fleet_plan": plan_fleet,
    "pd_shape_violations": shape_violations,
    "pd_rollout_targets": rollout_targets,
}
