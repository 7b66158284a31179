"""issue 21 "fail closed, round 3" #2: one owner per rendered key.

plugins/plugin_utils/data/owned_keys.yml names, for every flag, env variable and JSON key the renderer emits, the
inventory key that sets it. The first tests render the example and local inventories (and variants
that switch on every conditional flag) and fail when the renderer emits a key the table lacks, so
the table cannot go stale; the others check that a pass-through (extra_args, env, additional_config)
setting an owned key is refused with that exact inventory key in the fix.
"""

import copy
import json
import os

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet, launch, model
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import datafiles
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import guards
from test_fleet import cluster_a, example_fleet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
JSON_FLAGS = ("--additional-config", "--kv-transfer-config", "--speculative-config", "--compilation-config")


# ---- the inventories as Ansible merges them (hosts.yml inline vars, group_vars, host_vars) ----------

def _read(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def _walk(name, group, parents, groups, order, inline):
    lineage = parents + [name]
    for host, hv in ((group or {}).get("hosts") or {}).items():
        groups.setdefault(host, set()).update(lineage)
        inline.setdefault(host, {}).update(hv or {})
        if host not in order:
            order.append(host)
    for child, body in ((group or {}).get("children") or {}).items():
        _walk(child, body, lineage, groups, order, inline)


def inventory_fleet(directory):
    inv = _read(os.path.join(directory, "hosts.yml"))
    groups, order, inline = {}, [], {}
    _walk("all", inv["all"], [], groups, order, inline)
    hosts = []
    for name in (h for h in order if "pd_clusters" in groups[h]):
        merged = dict(inv["all"].get("vars") or {})
        for group in sorted(groups[name]):
            path = os.path.join(directory, "group_vars", f"{group}.yml")
            if os.path.exists(path):
                merged.update(_read(path))
        path = os.path.join(directory, "host_vars", f"{name}.yml")
        if os.path.exists(path):
            merged.update(_read(path))
        merged.update(inline.get(name) or {})
        hosts.append({"name": name, "groups": sorted(groups[name] - {"all"}), "vars": merged})
    return {"hosts": hosts, "limit": None}


def bare(f, change=None):
    """The fleet with no pass-through content (what the renderer alone emits), then ``change`` applied
    to every pd_cluster."""
    f = copy.deepcopy(f)
    seen = {}
    for host in f["hosts"]:
        raw = host["vars"]["pd_cluster"]
        if id(raw) not in seen:
            for role in ("prefill", "decode"):
                rcfg = raw.setdefault(role, {})
                rcfg["env"] = {}
                rcfg.setdefault("engine", {}).update(extra_args=[], additional_config={})
            if change:
                change(raw)
            seen[id(raw)] = raw
        host["vars"]["pd_cluster"] = seen[id(raw)]
    return f


def _tunable_env():
    """env defaults an operator's <role>.env may tune: defaults.yml env_common and model recipes' env."""
    names = set(datafiles.yaml_data("defaults.yml")["env_common"])
    for family in datafiles.yaml_data("models.yml").values():
        recipe = (family or {}).get("recipe") if isinstance(family, dict) else None
        for part in (recipe or {}, (recipe or {}).get("prefill") or {}, (recipe or {}).get("decode") or {}):
            names.update((part.get("env") or {}) if isinstance(part, dict) else {})
    return names


def _variant_partial(raw):
    raw["prefill"]["engine"].update(max_num_partial_prefills=2, max_long_partial_prefills=1,
                                    long_prefill_token_threshold=4096)


def _variant_eager(raw):
    for role in ("prefill", "decode"):
        raw[role]["engine"].update(enforce_eager=True, trust_remote_code=True)
    raw.setdefault("proxy", {})["waiting_retry_interval"] = 5


def _variant_single_connectors(raw):
    raw["prefill"].update(offload_connector="none")
    raw["decode"].update(offload_connector="none", recompute_scheduler=False)


VARIANTS = {"as is": None, "partial prefills": _variant_partial, "eager, remote code, proxy interval": _variant_eager,
            "one connector each": _variant_single_connectors}


def render(f):
    """Every launch spec of a fleet, rendered by the model alone (no rule can stop it: partial
    prefills > 1 are refused on every supported version but still a flag the renderer can emit)."""
    problems, incomplete = [], set()
    specs = []
    for name, (raw, hosts) in fleet._group_hosts(f, problems, incomplete).items():
        cluster = model.normalize(name, raw)
        topo, _ = model.topology(cluster, hosts)
        specs += [launch.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
                  for inst in topo["instances"] for rank in inst["ranks"]]
        specs.append(launch.proxy_spec(cluster, topo))
    assert [p for p in problems if p["level"] == "error"] == [] and not incomplete
    return specs


def rendered(specs):
    """{(kind, flag)}, {env names}, {json flag: {dotted paths}} of launch specs."""
    flags, env, paths = set(), set(), {}
    for spec in specs:
        command = spec["command"]
        for index, arg in enumerate(command):
            flag = guards._flag_name(arg)
            if flag:
                flags.add((spec["kind"], flag))
            if arg in JSON_FLAGS:
                paths.setdefault(arg, set()).update(guards._json_paths(json.loads(command[index + 1])))
        env.update(spec["env"])
    return flags, env, paths


@pytest.mark.parametrize("inventory", ["example", "local"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_key_the_renderer_emits_has_an_owner_in_the_table(inventory, variant):
    table = guards.owned_keys()
    flags, env, paths = rendered(render(bare(inventory_fleet(os.path.join(REPO, "inventories", inventory)),
                                             VARIANTS[variant])))
    assert flags, "nothing rendered"
    missing = [f"{kind} argv {flag}" for kind, flag in sorted(flags)
               if flag not in table["engine_argv" if kind == "engine" else "proxy_argv"]]
    missing += [f"env {name}" for name in sorted(env - _tunable_env()) if name not in table["engine_env"]]
    for flag, found in paths.items():
        owned = table["engine_json"][flag]
        # a path is covered by itself or by an owned key below it (an object the renderer builds)
        missing += [f"{flag} {p}" for p in sorted(found) if p not in owned and not any(k.startswith((p + ".", p + "[]")) for k in owned)]
    assert missing == [], f"rendered but not in plugins/plugin_utils/data/owned_keys.yml: {missing}"


def test_the_variants_switch_on_the_conditional_flags():
    # without this, a variant that silently stopped rendering its flag would keep the test above green
    flags = set()
    for change in VARIANTS.values():
        flags |= rendered(render(bare(inventory_fleet(os.path.join(REPO, "inventories", "example")), change)))[0]
    for flag in ("--max-num-partial-prefills", "--enforce-eager", "--trust-remote-code", "--tokenizer-mode",
                 "--enable-expert-parallel", "--data-parallel-rank"):
        assert ("engine", flag) in flags, flag
    assert ("proxy", "--waiting-retry-interval") in flags


def test_every_owner_names_an_inventory_key():
    table = guards.owned_keys()
    owners = list(table["engine_argv"].values()) + list(table["engine_env"].values()) + \
        list(table["proxy_argv"].values()) + [o for rows in table["engine_json"].values() for o in rows.values()]
    for owner in owners:
        assert "pd_cluster." in owner or owner.startswith("pd_"), owner


# ---- a pass-through may not set an owned key ---------------------------------------------------------

def errors(plan, field=None):
    return [v for v in plan["violations"] if v["level"] == "error" and (field is None or v["field"] == field)]


def with_a(change):
    a = cluster_a()
    change(a)
    return fleet.plan_fleet(example_fleet(a=a))


@pytest.mark.parametrize("extra, field", [
    ({"recompute_scheduler_enable": True}, "prefill.engine.additional_config.recompute_scheduler_enable"),
    ({"scheduler_config": {"recompute_scheduler_enable": True}},
     "prefill.engine.additional_config.scheduler_config.recompute_scheduler_enable"),
])
def test_recompute_scheduler_through_additional_config_is_refused_naming_the_switch(extra, field):
    plan = with_a(lambda a: a["prefill"].setdefault("engine", {}).update(additional_config=extra))
    found = errors(plan, field)
    assert found and "set pd_cluster.prefill.recompute_scheduler instead" in found[0]["fix"], plan["messages"]


def test_other_additional_config_keys_pass():
    plan = with_a(lambda a: a["prefill"].setdefault("engine", {}).update(
        additional_config={"enable_cpu_binding": True, "scheduler_config": {"some_other_knob": 1}}))
    assert [v for v in errors(plan) if "additional_config" in v["field"]] == [], plan["messages"]


@pytest.mark.parametrize("extra, key", [
    (["--tokenizer-mode", "auto"], "pd_cluster.recipe.tokenizer_mode"),
    (["--no-enable-expert-parallel"], "pd_cluster.recipe.enable_expert_parallel"),
    (["--reasoning-parser", "x"], "pd_cluster.recipe.reasoning_parser"),
    (["--additional-config.scheduler_config.recompute_scheduler_enable=true"], "pd_cluster.decode.recompute_scheduler"),
    (["--additional-config.enable_cpu_binding", "true"], "pd_cluster.decode.engine.additional_config"),
    (["-cc", '{"cudagraph_mode": "FULL"}'], "pd_cluster.decode.engine.cudagraph_mode"),
    (["--max-num-partial-prefills", "2"], "pd_cluster.decode.engine.max_num_partial_prefills"),
])
def test_extra_args_name_the_exact_inventory_key(extra, key):
    plan = with_a(lambda a: a["decode"].setdefault("engine", {}).update(extra_args=extra))
    found = errors(plan, "decode.engine.extra_args")
    assert found and f"set {key} instead" in found[0]["fix"], plan["messages"]


@pytest.mark.parametrize("name, key", [
    ("LD_PRELOAD", "pd_cluster.recipe.allocator_preload"),
    ("HCCL_IF_BASE_PORT", "pd_cluster.hccl_if_base_port"),
])
def test_env_names_the_exact_inventory_key(name, key):
    plan = with_a(lambda a: a["prefill"].update(env={name: "x"}))
    found = errors(plan, f"prefill.env.{name}")
    assert found and f"set {key} instead" in found[0]["fix"], plan["messages"]


def test_the_old_scattered_tables_are_gone():
    # one table: the guards read owned_keys.yml and keep no flag/env list of their own
    assert not hasattr(guards, "FLAG_KEYS") and not hasattr(guards, "ENV_KEYS")
    assert not hasattr(guards, "spec_violations")


def test_a_new_pass_through_dict_is_one_row_of_the_table(monkeypatch):
    # e.g. a knob for the Mooncake child's extra config: one pass_through row, no code change
    table = guards.owned_keys()
    table["pass_through"]["json"].append({"flag": "--kv-transfer-config", "key": "pd_cluster.<role>.engine.additional_config",
                                          "at": "kv_connector_extra_config"})
    monkeypatch.setattr(guards, "owned_keys", lambda: copy.deepcopy(table))
    plan = with_a(lambda a: a["decode"].setdefault("engine", {}).update(additional_config={"prefill": {"tp_size": 8}}))
    found = errors(plan, "decode.engine.additional_config.prefill.tp_size")
    assert found and "set pd_cluster.prefill.tp instead" in found[0]["fix"], plan["messages"]


@pytest.mark.parametrize("extra, field, key", [
    # the Mooncake child (cluster a's decode renders it beside the offload child, in a MultiConnector)
    ({"MooncakeHybridConnector": {"prefill": {"tp_size": 8}}},
     "decode.kv_connector_engine.extra_config.MooncakeHybridConnector.prefill.tp_size", "pd_cluster.prefill.tp"),
    # an offload child inside the MultiConnector: its extra config is a connectors[] item's
    ({"RecomputeCPUOffloadConnector": {"cpu_bytes_to_use_per_rank": 1}},
     "decode.kv_connector_engine.extra_config.RecomputeCPUOffloadConnector.cpu_bytes_to_use_per_rank",
     "pd_cluster.decode.cpu_offload"),
])
def test_the_engine_connector_knob_cannot_set_a_rendered_key(extra, field, key):
    # w/kv's kv_connector_engine.extra_config (molecule/real-engine) is a pass-through row of the table
    plan = with_a(lambda a: a["decode"].update(kv_connector_engine={"extra_config": extra}))
    found = errors(plan, field)
    assert found and f"set {key} instead" in found[0]["fix"], plan["messages"]


def test_the_engine_connector_knob_may_add_keys_nobody_renders():
    plan = with_a(lambda a: a["decode"].update(kv_connector_engine={
        "names": {"MooncakeHybridConnector": "MooncakeConnector"},
        "extra_config": {"MooncakeHybridConnector": {"mooncake_protocol": "tcp"}}, "multi": True}))
    assert not [v for v in errors(plan) if "kv_connector_engine" in v["field"]], plan["messages"]
