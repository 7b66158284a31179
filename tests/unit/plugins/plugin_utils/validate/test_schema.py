"""plugins/plugin_utils/schemas/*.json against what ships: inventories validate, schema and defaults cannot drift, and
each role's meta/argument_specs.yml lists exactly its defaults/main.yml (prometheus-community's CI
trick)."""

import glob
import json
import os

import jsonschema
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
ROLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "roles", "*")) if os.path.isdir(p))
INVENTORIES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "inventories", "*")))


def load_yaml(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_schema(name):
    with open(os.path.join(REPO, "plugins", "plugin_utils", "schemas", name), encoding="utf-8") as handle:
        return json.load(handle)


DEFAULTS = load_yaml("plugins", "plugin_utils", "data", "defaults.yml")
CLUSTER = load_schema("cluster.schema.json")
HOST = load_schema("host.schema.json")


def keys(schema_node):
    return set(schema_node["properties"])


def test_there_are_inventories_and_roles_to_check():
    assert {"example", "local"} <= set(INVENTORIES)
    assert {"pd_container", "pd_engine", "pd_plan", "pd_prechecks", "pd_proxy"} <= set(ROLES)


def test_schemas_are_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(CLUSTER)
    jsonschema.Draft202012Validator.check_schema(HOST)


# ---- shipped inventories ------------------------------------------------------------------------

def inventory_clusters(inv):
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "inventories", inv, "group_vars", "*.yml"))):
        data = load_yaml(path) or {}
        if "pd_cluster" in data:
            out.append((os.path.basename(path)[:-4], data["pd_cluster"]))
    return out


def inventory_host_vars(inv):
    """pd_* host variables from host_vars/*.yml and from hosts.yml (all: vars and host entries)."""
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "inventories", inv, "host_vars", "*.yml"))):
        found.append((os.path.basename(path)[:-4], load_yaml(path) or {}))
    hosts = load_yaml("inventories", inv, "hosts.yml")

    def walk(group, name):
        found.append((f"{name} vars", group.get("vars") or {}))
        for host, hv in (group.get("hosts") or {}).items():
            found.append((host, hv or {}))
        for child, sub in (group.get("children") or {}).items():
            walk(sub or {}, child)

    walk(hosts["all"], "all")
    return [(name, {k: v for k, v in hv.items() if k.startswith("pd_")}) for name, hv in found]


@pytest.mark.parametrize("inv", INVENTORIES)
def test_every_shipped_cluster_validates(inv):
    clusters = inventory_clusters(inv)
    assert clusters, f"inventories/{inv} has no pd_cluster"
    validator = jsonschema.Draft202012Validator(CLUSTER)
    for group, raw in clusters:
        errors = [e.message for e in validator.iter_errors(raw)]
        assert errors == [], f"inventories/{inv}/group_vars/{group}.yml: {errors}"
        assert raw["name"] == group


@pytest.mark.parametrize("inv", INVENTORIES)
def test_every_shipped_host_variable_validates(inv):
    validator = jsonschema.Draft202012Validator(HOST)
    for name, hv in inventory_host_vars(inv):
        errors = [e.message for e in validator.iter_errors(hv)]
        assert errors == [], f"inventories/{inv} {name}: {errors}"


def test_schema_rejects_a_typo_so_the_check_above_can_fail():
    validator = jsonschema.Draft202012Validator(CLUSTER)
    _, raw = inventory_clusters("example")[0]
    bad = json.loads(json.dumps(raw))
    bad["prefill"]["engine"]["blok_size"] = 32
    assert list(validator.iter_errors(bad))


# ---- schema vs defaults.yml ---------------------------------------------------------------------

def role_defaults():
    """Every key a role section may carry: role_common + prefill + decode (engine keys merged)."""
    top = set(DEFAULTS["role_common"]) | set(DEFAULTS["prefill"]) | set(DEFAULTS["decode"])
    engine = set(DEFAULTS["role_common"]["engine"]) | set(DEFAULTS["prefill"].get("engine", {})) \
        | set(DEFAULTS["decode"].get("engine", {}))
    return top, engine


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_schema_role_keys_equal_the_defaults(role):
    top, engine = role_defaults()
    node = CLUSTER["properties"][role]
    assert keys(node) == top
    assert keys(node["properties"]["engine"]) == engine


def test_prefill_and_decode_accept_the_same_shape():
    assert CLUSTER["properties"]["prefill"] == CLUSTER["properties"]["decode"]


def test_schema_cluster_keys_equal_defaults_plus_required_and_roles():
    required = set(CLUSTER["required"])
    assert required == {"name", "vllm_ascend_version", "image", "model"}
    assert keys(CLUSTER) == set(DEFAULTS["cluster"]) | required | {"prefill", "decode"}


@pytest.mark.parametrize("section", ["model", "workload", "proxy"])
def test_schema_nested_cluster_keys_equal_the_defaults(section):
    node = CLUSTER["properties"][section]
    assert keys(node) == set(DEFAULTS["cluster"][section]) | set(node.get("required", []))


def test_schema_host_keys_equal_the_host_defaults():
    # pd_npus <- host.npus, pd_hbm_per_npu <- host.hbm_per_npu, pd_host_ram <- host.ram, ...
    names = {"npus": "pd_npus", "hbm_per_npu": "pd_hbm_per_npu",
             "npu_first": "pd_npu_first", "ascend_root": "pd_ascend_root", "ram_reserve": "pd_host_ram_reserve",
             "npu_chip": "pd_npu_chip"}
    assert set(names) == set(DEFAULTS["host"])
    # required facts have no default (issue 12): the address, the HCCL NIC, the RAM; pd_machine
    # defaults to the address
    assert keys(HOST) == set(names.values()) | {"pd_host_address", "pd_hccl_if", "pd_host_ram", "pd_machine"}


def test_every_default_value_passes_the_schema():
    """A cluster spelling out every default explicitly is still valid (types agree)."""
    raw = {"name": "c", "vllm_ascend_version": "0.25.1", "image": "i", **json.loads(json.dumps(DEFAULTS["cluster"]))}
    raw["model"]["path"] = "/m"
    for role in ("prefill", "decode"):
        section = dict(DEFAULTS["role_common"], **{k: v for k, v in DEFAULTS[role].items() if k != "engine"})
        section["engine"] = dict(DEFAULTS["role_common"]["engine"], **DEFAULTS[role].get("engine", {}))
        raw[role] = section
    validator = jsonschema.Draft202012Validator(CLUSTER)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(raw)]
    assert errors == []


# ---- role argument specs vs defaults ------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_options_equal_role_defaults(role):
    defaults = load_yaml("roles", role, "defaults", "main.yml") or {}
    specs = load_yaml("roles", role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults), f"roles/{role}: argument_specs and defaults/main.yml differ"
    for name, option in specs.items():
        assert name.startswith(f"{role}_"), f"roles/{role}: public variable {name} lacks the role prefix"
        assert option.get("description"), f"roles/{role}: {name} has no description"
        if "default" in option:
            assert option["default"] == defaults[name], f"roles/{role}: default of {name} differs"
        else:
            assert option.get("required") is True, f"roles/{role}: {name} has neither default nor required"


def test_without_jsonschema_the_shape_check_names_the_missing_package(monkeypatch):
    # the filters must still load (ansible-test sanity's import test; Ansible would skip the whole plugin)
    # and the plan then says what to install, instead of "No filter named ..."
    from ansible_collections.pd.deploy.plugins.plugin_utils.plan import shape
    from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
    monkeypatch.setattr(shape, "jsonschema", None)
    shape._validator_class.cache_clear()
    try:
        with pytest.raises(PdError) as info:
            shape.shape_violations({}, "cluster.schema.json", "cluster_a")
    finally:
        monkeypatch.undo()
        shape._validator_class.cache_clear()
    assert (info.value.where, info.value.field) == ("cluster_a", "jsonschema")
    assert "requirements.txt" in str(info.value)
    assert shape.shape_violations({}, "cluster.schema.json", "cluster_a")  # back with the package: violations
