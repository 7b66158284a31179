"""Recipe parity (issue 10): what pd-deploy renders against upstream's published configurations.

Each tests/fixtures/upstream/*.yml records one published DeepSeek-V4-Flash PD configuration of
vllm-ascend (the tutorial's A2 and A3 templates, the nightly CI config) as facts with their ref, path
and line. For each, the test writes the equivalent inventory from those facts alone (topology,
ports, the engine sizes an operator sets: max-model-len, max-num-seqs, batched tokens, block size,
memory share, prefix caching, MTP tokens, served name), renders rank 0 of instance 0 of each role
with pd_deploy, and compares argv flags, env, the --kv-transfer-config and the --additional-config
leaf by leaf. Everything the model family's recipe decides (tokenizer mode, parsers, expert
parallel, quantization, graph modes, env) is NOT copied into the inventory: that is what is proven.

Every difference must be a row of the one table in docs/upstream-deviations.md (fixture, role, item,
upstream value, our value, reason); an unlisted difference fails, and so does a row that no longer
matches anything (the table cannot go stale).
"""

import glob
import json
import os
import re

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import launch, model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
FIXTURES = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "upstream", "*.yml")))
TABLE = os.path.join(REPO, "docs", "upstream-deviations.md")
ROLES = ("prefill", "decode")
JSON_FLAGS = ("--kv-transfer-config", "--additional-config")
#: vllm-ascend ref of a fixture -> pd_cluster.vllm_ascend_version and its published image tag
REF_VERSION = {"main": ("main", "nightly-main"), "v0.25.1rc1": ("0.25.1rc1", "v0.25.1rc1")}
ABSENT = "-"


def load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def values(entries):
    return {k: v.get("value") for k, v in entries.items()}


# ---- the equivalent inventory, from the fixture's facts -------------------------------------------

def role_inventory(facts):
    topo, flags, env = facts["topology"], values(facts["flags"]), values(facts["env"])
    spec = flags.get("--speculative-config") or {}
    retention = env.get("VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
    return {
        "instances": topo["instances"], "dp": topo["dp"], "tp": topo["tp"],
        "port_base": topo["port_start"], "kv_port": topo["kv_ports"][0], "dp_rpc_port": topo["dp_rpc_port"],
        "mooncake": True, "offload_connector": "none",
        "recompute_scheduler": bool(facts["additional_config"]["value"].get("recompute_scheduler_enable")),
        "engine": {
            "max_model_len": int(flags["--max-model-len"]),
            "max_num_seqs": int(flags["--max-num-seqs"]),
            "max_num_batched_tokens": int(flags["--max-num-batched-tokens"]),
            "block_size": int(flags["--block-size"]),
            "gpu_memory_utilization": float(flags["--gpu-memory-utilization"]),
            # vLLM V1 caches prefixes unless told not to
            "enable_prefix_caching": "--no-enable-prefix-caching" not in flags,
            "prefix_cache_retention_interval": int(retention) if retention is not None else None,
            "num_speculative_tokens": int(spec.get("num_speculative_tokens", 0)),
        },
    }


def inventory(fx):
    """``(pd_cluster, host records)`` equivalent to the fixture."""
    version, tag = REF_VERSION[fx["source"]["ref"]]
    pre, dec = fx["roles"]["prefill"], fx["roles"]["decode"]
    npus = pre["topology"]["npus_per_host"]
    raw = {
        "name": "upstream", "vllm_ascend_version": version,
        "image": f"quay.io/ascend/vllm-ascend:{tag}{'-a3' if npus == 16 else ''}",
        # vLLM serves a model under its path unless --served-model-name says otherwise
        "model": {"path": fx["model"]["path"],
                  "served_name": pre["flags"].get("--served-model-name", {"value": fx["model"]["path"]})["value"]},
        "mooncake_connector": pre["kv_transfer_config"]["value"]["kv_connector"],
        "prefill": role_inventory(pre), "decode": role_inventory(dec),
    }
    hosts = []
    for role, facts in (("prefill", pre), ("decode", dec)):
        for i in range(facts["topology"]["hosts"]):
            hosts.append(model.host_record(f"{role[0]}{i}", role, {
                "pd_host_address": f"10.0.{ROLES.index(role)}.{i + 1}", "pd_npus": facts["topology"]["npus_per_host"],
                # host facts validation requires; the upstream scripts take them from the operator too
                "pd_hccl_if": "eth0", "pd_host_ram": "1TiB"}))
    return raw, hosts


def rendered(fx):
    """{role: spec of rank 0 of instance 0} as pd_deploy renders the equivalent inventory."""
    raw, hosts = inventory(fx)
    cluster = model.normalize(raw["name"], raw)
    topo, _ = model.topology(cluster, hosts)
    out = {}
    for inst in topo["instances"]:
        if inst["index"] == 0:
            rank = inst["ranks"][0]
            out[inst["role"]] = launch.rank_spec(cluster, inst, rank, topo["hosts"][rank["host"]])
    return out


# ---- comparison ------------------------------------------------------------------------------------

def argv_flags(command, model_path):
    """``{flag: value}`` of a ``vllm serve <model> ...`` argv (True for a bare flag, dicts for JSON)."""
    assert command[:3] == ["vllm", "serve", model_path]
    out, i = {}, 3
    while i < len(command):
        flag = command[i]
        nxt = command[i + 1] if i + 1 < len(command) else None
        if nxt is not None and not nxt.startswith("--"):
            out[flag] = json.loads(nxt) if nxt.startswith("{") else nxt
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def leaves(value, prefix=""):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def text(value):
    """A value as the table writes it: strings bare, everything else compact JSON, absent '-'."""
    if value is ABSENT:
        return ABSENT
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def compare(kind, upstream, ours):
    """[(item, upstream text, our text)] of one kind (flag, env, kv, additional)."""
    out = []
    for key in list(upstream) + [k for k in ours if k not in upstream]:
        up, mine = upstream.get(key, {"value": ABSENT}), ours.get(key, ABSENT)
        if up.get("host_specific"):
            if mine is ABSENT:
                out.append((f"{kind} {key}", "(host specific)", ABSENT))
            continue
        if up["value"] != mine:
            out.append((f"{kind} {key}", text(up["value"]), text(mine)))
    return out


def differences(fx):
    """[(role, item, upstream, ours)] between the fixture and the rendered specs."""
    specs = rendered(fx)
    out = []
    for role in ROLES:
        facts, spec = fx["roles"][role], specs[role]
        flags = argv_flags(spec["command"], fx["model"]["path"])
        ours_flags = {k: v for k, v in flags.items() if k not in JSON_FLAGS}
        items = compare("flag", facts["flags"], ours_flags)
        items += compare("env", facts["env"], spec["env"])
        for kind, flag, key in (("kv", "--kv-transfer-config", "kv_transfer_config"),
                                ("additional", "--additional-config", "additional_config")):
            up = {k: {"value": v} for k, v in leaves((facts.get(key) or {}).get("value") or {}).items()}
            items += compare(kind, up, leaves(flags.get(flag) or {}))
        out += [(role,) + item for item in items]
    return out


def table():
    """Rows of the deviations table: dicts with fixture, role, item, upstream, ours, reason."""
    with open(TABLE, encoding="utf-8") as handle:
        lines = [ln.strip() for ln in handle if ln.strip().startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["fixture", "role", "item", "upstream", "ours", "reason"], header
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip("|"))]
        row = dict(zip(header, [c.replace("\\|", "|").strip("`") for c in cells]))
        assert row["reason"].strip(), f"deviation without a reason: {ln}"
        rows.append(row)
    return rows


def listed(row, name, diff):
    role, item, up, ours = diff
    fixtures = [f.strip() for f in row["fixture"].split(",")]
    return (("*" in fixtures or name in fixtures) and row["role"] in ("*", role) and row["item"] == item
            and row["upstream"] == up and row["ours"] == ours)


# ---- tests -----------------------------------------------------------------------------------------

def test_fixtures_cover_the_tutorial_templates_and_the_nightly_config():
    names = {load(p)["name"] for p in FIXTURES}
    assert {"tutorial-a2-main", "tutorial-a3-main", "nightly-w8a8-pd-prefix", "tutorial-a2-v0.25.1rc1"} <= names


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_every_fixture_value_has_its_provenance(path):
    fx = load(path)
    assert set(fx["source"]) == {"repo", "ref", "commit", "path"} and re.fullmatch(r"[0-9a-f]{40}", fx["source"]["commit"])
    assert isinstance(fx["model"]["line"], int)
    for role in ROLES:
        facts = fx["roles"][role]
        assert isinstance(facts["topology"]["line"], int)
        for kind in ("flags", "env"):
            for key, entry in facts[kind].items():
                assert isinstance(entry.get("line"), int) and entry["line"] > 0, (role, kind, key)
                assert "value" in entry or entry.get("host_specific"), (role, kind, key)
        for key in ("kv_transfer_config", "additional_config"):
            assert isinstance(facts[key]["line"], int) and isinstance(facts[key]["value"], dict), (role, key)


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_rendered_specs_match_upstream_up_to_the_listed_deviations(path):
    fx = load(path)
    rows = table()
    unlisted = [d for d in differences(fx) if not any(listed(r, fx["name"], d) for r in rows)]
    assert not unlisted, (
        f"{fx['name']}: differences from upstream not in docs/upstream-deviations.md "
        "(role, item, upstream, ours):\n" + "\n".join(" | ".join(d) for d in unlisted))


def test_every_listed_deviation_still_occurs():
    rows = table()
    diffs = [(load(p)["name"], d) for p in FIXTURES for d in differences(load(p))]
    stale = [r for r in rows if not any(listed(r, name, d) for name, d in diffs)]
    assert not stale, "rows of docs/upstream-deviations.md that match no difference any more:\n" + "\n".join(
        f"{r['fixture']} {r['role']} {r['item']}: {r['upstream']} -> {r['ours']}" for r in stale)


def test_the_recipe_is_what_closes_the_gap():
    """A generic (non-V4) family renders none of the recipe, so the same inventory then differs in the
    recipe's flags: the parity above comes from the data, not from the inventory."""
    fx = load(os.path.join(REPO, "tests", "fixtures", "upstream", "tutorial-a2-main.yml"))
    raw, hosts = inventory(fx)
    raw["model"]["family"] = "generic"
    cluster = model.normalize("upstream", raw)
    topo, _ = model.topology(cluster, hosts)
    inst = next(i for i in topo["instances"] if i["role"] == "decode")
    cmd = launch.rank_spec(cluster, inst, inst["ranks"][0], topo["hosts"][inst["ranks"][0]["host"]])["command"]
    for flag in ("--tokenizer-mode", "--enable-expert-parallel", "--quantization", "--compilation-config"):
        assert flag in values(fx["roles"]["decode"]["flags"]) and flag not in cmd
