"""Plan a whole fleet: shape check, normalization, topology, rules, launch specs, capacity.

``plan_fleet(fleet)`` is what ``playbooks/validate.yml`` runs once on the controller. It never
raises for bad inventory content: every problem becomes a violation dict (docs/design.md), all of
them are returned at once, and specs are only rendered for clusters without errors.
"""


import math

import jsonschema
import jsonschema.validators

from ..rollout.containers import (containers_to_start, host_specs, moved_image_warnings, moved_images, orphans,
                                  spec_ports, spec_state, start_reason, wiring_differs)
from ..shared import datafiles, sizes, text
from ..shared.errors import PdError
from ..validate import guards, inventory, limits, rules, secrets
from ..validate.violation import violation
from . import capacity, model, ports, versions

HOST_VARS = inventory.HOST_FACTS
#: Group names every inventory has or pd-deploy gives a meaning: a cluster named like one of them
#: would take in hosts of other clusters (every decode host is in 'decode').
RESERVED_GROUPS = ("all", "ungrouped", "pd_clusters", "prefill", "decode")


def schema(name):
    """A fresh copy of ``schemas/<name>``."""
    return datafiles.schema(name)


def _strict_integer(checker, instance):
    """JSON Schema "integer" as the engines read it: an int, not a bool, not a float.

    Since draft 6 JSON Schema calls 8000.0 an integer (jsonschema 4.26.0 jsonschema/_types.py
    draft6_type_checker accepts a float whose fraction is 0), but YAML's ``8000.0`` is a Python float:
    rendered it becomes ``--port 8000.0``, which vLLM's argparse ``int`` / ``human_readable_int`` (vllm@v0.27.1
    vllm/utils/argparse_utils.py) and the
    proxy's ``type=int`` refuse at start, and every rule that compares ints skipped it. Refused, not
    normalized to 8000: the operator sees the value they wrote in the plan, the rules and the renderer
    keep one type, and ``8000.5`` must be refused anyway (README "Fail closed").
    """
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with the strict integer above (every schema of pd-deploy is checked with it).
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer))


def _number_text(value):
    """True for a string that reads as a number (``"8000"``, ``" 0.85 "``): quoted in YAML by mistake."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str) and value.strip().lower().lstrip("+-") not in ("nan", "inf", "infinity")


def _type_explained(err, schema_name):
    """(message, fix) of a number of the wrong type, or None for other type errors."""
    expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    value = err.instance
    if "integer" in expected and isinstance(value, float):
        if value.is_integer():
            return (f"{value!r} is a float, the field takes a whole number: rendered it would read "
                    f"{value!r}, which vLLM's and the proxy's int parsers refuse at start",
                    f"write {int(value)} (see schemas/{schema_name})")
        return f"{value!r} is not a whole number", f"write a whole number (see schemas/{schema_name})"
    if ("integer" in expected or "number" in expected) and _number_text(value):
        kind = "a whole number" if "integer" in expected else "a number"
        return (f"{value!r} is quoted text, the field takes {kind}",
                f"write {value.strip()} without quotes (see schemas/{schema_name})")
    return None


def _non_finite(instance, path=()):
    """Paths of every NaN / infinite float in a YAML value (JSON Schema's bounds let NaN through)."""
    if isinstance(instance, float) and not math.isfinite(instance):
        yield path
    elif isinstance(instance, dict):
        for key, value in instance.items():
            yield from _non_finite(value, path + (str(key),))
    elif isinstance(instance, list):
        for index, value in enumerate(instance):
            yield from _non_finite(value, path + (str(index),))


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_size_schema(schema_part):
    return isinstance(schema_part, dict) and schema_part.get("title") == "size"


def _explain(err, schema_name):
    """(message, fix) of one JSON Schema error in words an operator can act on."""
    subschema = err.schema if isinstance(err.schema, dict) else {}
    sizes_involved = _is_size_schema(subschema) or any(_is_size_schema(e.schema) for e in err.context or [])
    if sizes_involved and isinstance(err.instance, float) and err.instance.is_integer() and err.instance >= 0:
        whole = int(err.instance)
        return (f"{err.instance!r} is a float: a size is an integer byte count or a number with a unit",
                f"write {whole} or {sizes.to_human(whole)}")
    if sizes_involved and err.instance is not None:
        try:
            sizes.to_bytes(err.instance, field="size", where="schema")
        except PdError as exc:
            return exc.problem, exc.fix
        return (f"{_shown(err.instance)} is not a size here", f"write {sizes.GRAMMAR}")
    description = subschema.get("description")
    if err.validator == "type":
        typed = _type_explained(err, schema_name)
        if typed:
            return typed
    if err.validator in ("oneOf", "anyOf"):
        kinds = [c.get("type") or c.get("enum") or c.get("title") for c in err.validator_value
                 if isinstance(c, dict)]
        expected = description or " or ".join(str(k) for k in kinds if k)
        return (f"{_shown(err.instance)} is not valid: expected {expected}",
                f"see schemas/{schema_name} for the accepted values")
    if err.validator == "pattern":
        expected = description or f"text matching {err.validator_value}"
        return f"{_shown(err.instance)} is not valid: expected {expected}", f"see schemas/{schema_name}"
    if err.validator == "propertyNames":
        return (f"{_shown(err.instance)} has a key that is not valid: {description or err.message}",
                f"see schemas/{schema_name}")
    message = err.message
    if description and err.validator in ("type", "minimum", "maximum", "minLength", "enum", "not"):
        message = f"{message} ({description})"
    return message, f"see schemas/{schema_name} for the accepted values"


def shape_violations(instance, schema_name, where, prefix=""):
    """Every JSON Schema error of ``instance`` as a violation, with a dotted field path."""
    validator = Validator(schema(schema_name))
    out = []
    for path in _non_finite(instance):
        field = ".".join(p for p in (prefix, *path) if p)
        out.append(violation("error", where, field, "is not a finite number (NaN or infinity)", "write a finite number"))
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in err.absolute_path)
        if isinstance(err.instance, float) and not math.isfinite(err.instance):
            continue  # reported above, once
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            # one violation per unknown key, named by its full path (prefill.engine.blok_size)
            known = (err.schema or {}).get("properties") or {}
            for key in [k for k in err.instance if k not in known]:
                field = ".".join(str(p) for p in (prefix, path, key) if p)
                out.append(violation("error", where, field, f"unknown key {key!r}",
                                     "remove or rename the key (see inventories/example for the accepted keys)"))
            continue
        if err.validator == "required":
            # one violation per missing key, each named (a missing model is reported as model)
            for key in [k for k in err.validator_value if k not in (err.instance or {})]:
                field = ".".join(p for p in (prefix, path, key) if p)
                out.append(violation("error", where, field, "missing (required, no default)",
                                     f"add the key {key} (see inventories/example)"))
            continue
        field = ".".join(p for p in (prefix, path) if p) or prefix or "(top level)"
        message, fix = _explain(err, schema_name)
        out.append(violation("error", where, field, message, fix))
    return out


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
    """pd_deploy_break_lock kept in the inventory (filter_plugins/pd.py marks where), once per file."""
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
                 f"(pd_deploy/data/models.yml), HBM the device exposes x gpu_memory_utilization - weights - reserve")
        extra = {"weights_per_npu_bytes": worst["weights"]["total_bytes"],
                 "reserve_per_npu_bytes": worst["reserve"]["total_bytes"],
                 "usable_per_npu_bytes": worst["usable_per_npu_bytes"],
                 "expert_parallel_size": worst["weights"]["ep_size"],
                 "quantization": est["quantization"], "weights_fit": all(b["fits"] for b in est["hosts"].values())}
        per_host = {n: est["hosts"][n]["kv_per_npu_bytes"] * npus_used[n] for n in npus_used}
    else:
        share = capacity.ARTICLE_KV_SHARE
        per_host = {h["name"]: int(h["hbm_per_npu_bytes"] * npus_used[h["name"]]
                                   * sizes.check_number(eng["gpu_memory_utilization"], "gpu_memory_utilization",
                                                        "pd_capacity") * share) for h in hosts}
        per_npu = min(int(h["hbm_per_npu_bytes"] * sizes.check_number(eng["gpu_memory_utilization"],
                                                                       "gpu_memory_utilization", "pd_capacity")
                          * share) for h in hosts)
        basis = (f"article rule of thumb: HBM x gpu_memory_utilization x {share} (no weights data for model "
                 f"family {cluster['model'].get('family')!r} in pd_deploy/data/models.yml)")
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
        specs = [model.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
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
    proxy = model.proxy_spec(cluster, topo)
    for spec in specs + [proxy]:  # README "Secrets": the key as a redaction, the real value at docker run
        secrets.protect(spec, key_redaction, model.spec_hash)
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
    """Port claims (pd_deploy/ports.py) of a cluster that rendered; [] for one that did not."""
    if not result["specs"]:
        return []
    try:
        row = versions.version_row(result["cluster"]["vllm_ascend_version"])
        return ports.claims(result["cluster"], result["topology"], row)
    except PdError:
        return []  # the cluster's own rules report it


def plan_fleet(fleet):
    """Plan every cluster of ``fleet`` ({"hosts": [{name, groups, vars}], "limit": [names]|None}).

    Returns {"ok", "violations", "clusters": {name: summary}, "hosts": {name: {cluster, role,
    specs, proxy}}, "batches": [host counts per cluster in play order]}.
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
                "address": host["address"],
            }
        for spec in result["specs"]:
            plan["hosts"][spec["host"]]["specs"].append(spec)
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
        }
    violations.extend(port_collisions(all_specs, address_of, ports.port_spaces(
        (name, machine, address) for name, (machine, address) in machine_of.items())))
    violations.extend(inventory.machine_violations(
        [h for _, hosts in grouped.values() for h in hosts], all_specs))
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
    (key = the host's address:the rank's HTTP port, as model.proxy_spec writes --*-hosts/--*-ports)."""
    out = {}
    for spec in specs:
        insts = out.setdefault(spec["role"], [])
        if not insts or insts[-1]["instance"] != spec["instance"]:
            insts.append({"instance": spec["instance"], "ranks": []})
        insts[-1]["ranks"].append({"name": spec["name"], "host": spec["host"],
                                   "key": f"{address_of[spec['host']]}:{spec['ports']['http']}"})
    return out


#: The engine roles of a cluster, in the order their serving instances are drained one at a time (a
#: role name of its own; the first wave starts the ranks of every role together).
ENGINE_ROLES = ("decode", "prefill")


def rollout_waves(plan, cluster, role, probes):
    """The order in which a rollout replaces the ``role`` ranks of ``cluster`` (the same on every host).

    ``role`` is "decode", "prefill" or "all" (both: what pd_rollout passes). ``probes`` is {host:
    pd_host_probe result} of the batch. Ranks with nothing to do are left out. Waves, of every role
    together where nothing orders them (docs/design.md, "Rollout waves": decode pulls the KV of each
    request from prefill, the proxy routes only once both answer):

    1. the ranks of instances with nothing serving behind the running proxy (a first deploy, a stopped
       cluster, the proxy not running, new instances) start together, without drain;
    2. each instance serving behind the running proxy while its role has others is a wave of its own:
       taken out of the proxy, drained, replaced, health-checked, put back, one instance at a time, so
       that the role's other instances keep serving (decode instances, then prefill);
    3. the serving ranks of a role that cannot be drained (a single instance: the proxy keeps picking it
       even when isolated; or drain_timeout_s 0) are replaced together last, after every drained wave
       passed: their replacement interrupts the role, and a failed wave before it leaves them serving.

    Without drain waves 1 and 3 are one wave: a version row or image change of a cluster with one
    instance per role replaces its prefill and decode ranks together. Returns [{label, role, names,
    drain: [proxy keys], proxy_host, proxy_url, proxy_name, serving_file, join, timeout_s}] (role: the
    role the wave drains, or the roles of the wave joined with "+"; join: {role: [keys]} the proxy must
    serve before a drain wave drains - every instance of the plan, so the ones wave 1 started are
    added before any serving instance is taken out).
    """
    roles = list(ENGINE_ROLES) if role == "all" else [role]
    summary = plan["clusters"][cluster]
    proxy = summary.get("proxy")
    seen = {h: {c["name"]: c for c in (p or {}).get("containers") or []} for h, p in (probes or {}).items()}
    proxy_up = bool(proxy) and bool((seen.get(proxy["host"], {}).get(proxy["name"]) or {}).get("running"))
    timeout = summary.get("drain_timeout_s") or 0
    fresh, undrained, waves = {}, {}, []
    for one in roles:
        instances = (summary.get("instances") or {}).get(one, [])
        # with one instance nothing else serves the role: the proxy keeps picking it even when isolated,
        # so a drain would only wait for its bound
        drain_on = timeout > 0 and len(instances) > 1
        for inst in instances:
            todo, serving = [], False
            for rank in inst["ranks"]:
                spec = next(s for s in plan["hosts"][rank["host"]]["specs"] if s["name"] == rank["name"])
                found = seen.get(rank["host"], {})
                if containers_to_start([spec], list(found.values())):
                    todo.append(rank["name"])
                serving = serving or bool((found.get(rank["name"]) or {}).get("running"))
            if not todo:
                continue
            if proxy_up and serving and drain_on:
                waves.append({"label": f"{one} instance {inst['instance']}", "role": one, "names": todo,
                              "drain": [r["key"] for r in inst["ranks"]]})
            else:
                (undrained if proxy_up and serving else fresh).setdefault(one, []).extend(todo)

    def together(groups, how):
        return [{"label": f"{' and '.join(groups)} ranks {how}", "role": "+".join(groups),
                 "names": [n for names in groups.values() for n in names], "drain": []}] if groups else []

    if not waves:
        merged = {one: fresh.get(one, []) + undrained.get(one, []) for one in roles if one in fresh or one in undrained}
        out = together(merged, "started together")
    else:
        out = (together(fresh, "started together") + waves
               + together(undrained, "replaced without drain (no other instance serves their role)"))
    for wave in out:
        wave.update(proxy_host=proxy["host"] if proxy else None, timeout_s=timeout,
                    proxy_url=f"http://127.0.0.1:{proxy['ports']['http']}" if proxy else None,
                    proxy_name=proxy["name"] if proxy else None,
                    serving_file=(proxy or {}).get("serving_file") or "",
                    # what the proxy must serve before this wave drains (issue 20 item 4): instances
                    # started by an earlier wave join first, so the role never runs out of instances
                    join=(proxy or {}).get("backends") or {} if wave["drain"] else {})
    return out


_BATCH_FIX = ("write -e pd_cluster_batch=N (N clusters per batch, N >= 1) or P% (P in 1..100, a share of "
              "the clusters to roll, at least one), or leave it out to roll one cluster at a time")


def cluster_batch_size(value, clusters, parallel=False):
    """How many clusters one rollout batch holds: ``pd_cluster_batch`` as the operator wrote it.

    ``value`` is None (unset: one cluster at a time, or every cluster with ``parallel``), a count
    (2, "2") or a percentage of the ``clusters`` to roll ("25%", rounded down, at least 1, as Ansible's
    ``serial`` rounds). Anything else is refused, naming the value and the fix; so is a batch given
    together with pd_parallel_clusters=true (two answers to one question).
    """
    if value is None or value == "":
        return max(clusters, 1) if parallel else 1
    if parallel:
        raise PdError("deploy-pd.yml", "pd_cluster_batch",
                      f"{value!r} is given together with pd_parallel_clusters=true",
                      "give one of them: pd_parallel_clusters=true rolls every cluster at once, the same as "
                      "pd_cluster_batch=100%")
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.endswith("%") and text[:-1].isdigit():
        share = int(text[:-1])
        if 1 <= share <= 100:
            return max(1, clusters * share // 100)
        raise PdError("deploy-pd.yml", "pd_cluster_batch", f"{value!r} is not a share between 1% and 100%", _BATCH_FIX)
    if isinstance(text, str) and text.isdigit():
        text = int(text)
    if isinstance(text, int) and not isinstance(text, bool) and text >= 1:
        return text
    raise PdError("deploy-pd.yml", "pd_cluster_batch",
                  f"{value!r} is neither a number of clusters (1 or more) nor a percentage", _BATCH_FIX)


def cluster_batch_problem(value, parallel=False):
    """The refusal of ``pd_cluster_batch`` as a message ('' when it is fine), for a plain fail task."""
    try:
        cluster_batch_size(value, 1, parallel)
    except PdError as err:
        return str(err)
    return ""


def rollout_batches(play_hosts, hosts, per=1):
    """The play's ``serial`` list: sizes of runs of ``per`` consecutive clusters of ``play_hosts``
    (a cluster's hosts are consecutive in the play), the last batch holding what is left."""
    batches = []
    last = object()
    count = 0
    for name in play_hosts:
        cluster = (hosts.get(name) or {}).get("cluster")
        if cluster == last:
            batches[-1] += 1
            continue
        last = cluster
        if count % per == 0:
            batches.append(1)
        else:
            batches[-1] += 1
        count += 1
    return batches or [1]


def rollout_targets(plan, probes, play_hosts, cluster_batch=None, parallel=False):
    """Which clusters a deploy must roll, from what pd_host_probe found on every host of the play.

    A cluster is rolled when any of its containers (engine ranks, proxy) on a host of the play is not
    running its current launch spec; the others were only probed (health) and are left as they are.
    ``probes`` is {host: pd_host_probe result}. Returns {"hosts": [hosts of the clusters to roll, in
    play order], "batches": the play's serial list for them (``cluster_batch`` clusters per batch, see
    cluster_batch_size; every cluster at once with ``parallel``), "changed": [clusters], "unchanged":
    [clusters], "pending": {host: [container names not running their spec]}, "reasons": {host: {name: why
    it is started or re-wired, in words}}, "removed": {host: [containers of ranks the inventory no
    longer has]}}. A cluster is also rolled when its running proxy lists other instances than the plan
    (re-wired live, not recreated: its spec hash leaves its backends out) or a host runs such a
    container (drained out of the proxy, then removed).

    Also "images": {host: {name: image ID}}: the image a container runs its current spec on, else the one
    its reference names on the host now (what it is started from); "moved": [moved_images of each host,
    with cluster and host] and "warnings": their WARNING lines (a moved tag recreates nothing).
    """
    if not isinstance(probes, dict):
        raise PdError("pd_rollout_targets", "probes", "expected {host: pd_host_probe result}",
                      "pass the registered probe of every play host (roles/pd_prechecks)")
    pending = {}
    reasons = {}
    rewire = []
    removed = {}
    touched = []
    images = {}
    moved = []
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
        todo = containers_to_start(host_specs(entry), probe["containers"])
        refs = probe.get("image_refs") or {}
        images[host] = _image_ids(host_specs(entry), probe["containers"], refs)
        moved.extend(dict(m, cluster=entry["cluster"], host=host)
                     for m in moved_images(host_specs(entry), probe["containers"], refs))
        if todo:
            pending[host] = [s["name"] for s in todo]
            reasons[host] = {s["name"]: start_reason(s, probe["containers"]) for s in todo}
        proxy = entry.get("proxy")
        if proxy and proxy["name"] not in pending.get(host, []) and \
                wiring_differs(proxy, (probe.get("wiring") or {}).get(proxy["name"])):
            rewire.append(entry["cluster"])
            reasons.setdefault(host, {})[proxy["name"]] = "re-wired live: its instances were added or removed"
        dropped = orphans(entry, probe["containers"], host)
        if dropped:
            removed[host] = dropped
    changed = [c for c in touched if any(plan["hosts"][h]["cluster"] == c for h in list(pending) + list(removed))
               or c in rewire]
    hosts = [h for h in play_hosts if h in plan["hosts"] and plan["hosts"][h]["cluster"] in changed]
    per = cluster_batch_size(cluster_batch, len(changed), parallel)
    return {"hosts": hosts, "batches": rollout_batches(hosts, plan["hosts"], per) if hosts else [1],
            "changed": changed, "unchanged": [c for c in touched if c not in changed], "pending": pending,
            "reasons": reasons, "removed": removed, "images": images, "moved": moved,
            "warnings": moved_image_warnings(moved)}


def _image_ids(specs, containers, refs):
    """{name: image ID} of a host's specs: the one a container runs its current spec on, else the one the
    spec's reference names now (left out when neither is known)."""
    found = {c["name"]: c for c in containers}
    out = {}
    for spec in specs:
        running = found[spec["name"]].get("image_id") if spec_state(spec, found) == "current" else None
        image_id = running or (refs.get(spec.get("image")) or {}).get("id")
        if image_id:
            out[spec["name"]] = image_id
    return out


def lock_hosts(plan, play_hosts):
    """[{cluster, host}] for the clusters of ``play_hosts``: each cluster's deploy lock lives on its first
    host in sorted order among all of the cluster's hosts (the same host whatever --limit says)."""
    out = []
    for name in play_hosts:
        entry = plan["hosts"].get(name)
        if entry is None or any(o["cluster"] == entry["cluster"] for o in out):
            continue
        members = sorted(h for h, e in plan["hosts"].items() if e["cluster"] == entry["cluster"])
        out.append({"cluster": entry["cluster"], "host": members[0]})
    return out


def human(n):
    """Bytes as a short binary size for summaries."""
    return sizes.to_human(n)


FILTERS = {
    "pd_fleet_plan": plan_fleet,
    "pd_shape_violations": shape_violations,
    "pd_rollout_targets": rollout_targets,
    "pd_lock_hosts": lock_hosts,
    "pd_rollout_waves": rollout_waves,
    "pd_cluster_batch_problem": cluster_batch_problem,
}
