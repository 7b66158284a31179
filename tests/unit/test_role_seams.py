"""Roles with declared seams (issue 22, item 5).

- the Docker socket has one default (plugins/plugin_utils/data/variables.yml), which the plan carries to every role
  and playbook as ``hosts.<host>.docker_socket``; no second literal;
- one build-dir variable: pd_plan_build_dir, whose default (pd_plan's defaults and argument spec) is the
  only place the build directory is spelled out; everything else reads hostvars['localhost'].pd_plan_build_dir;
- no role reads another role's private (``_pd_<role>_*`` / ``__pd_<role>_*``) variables, and no playbook
  or scenario reads any;
- no Jinja statements (``{% ... %}``) in roles or playbooks: logic lives in filters;
- every entry point a role or playbook uses (``tasks_from``) is declared in the target role's
  meta/argument_specs.yml, and is called with its declared public options;
- the operations roles and playbooks read the normalized clusters from the plan
  (``clusters.<c>.config``) instead of normalizing ``pd_cluster`` again.
"""

import glob
import os
import re

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import inventory
from tests.unit.plugins.plugin_utils.plan.test_fleet import example_fleet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "roles", "*")) if os.path.isdir(p))
SOCKET = "/var/run/docker.sock"


def _files(*patterns):
    out = []
    for pattern in patterns:
        out.extend(glob.glob(os.path.join(REPO, pattern), recursive=True))
    return sorted(set(out))


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _rel(path):
    return os.path.relpath(path, REPO)


#: Ansible content: roles, playbooks, the entry playbooks at the top.
ANSIBLE = ("roles/**/*.yml", "playbooks/**/*.yml", "*.yml")
#: Controller code that could hold a default of its own.
PYTHON = ("plugins/plugin_utils/**/*.py", "plugins/filter/*.py", "plugins/action/*.py", "plugins/vars/*.py", "tools/*.py")


# ---- the Docker socket --------------------------------------------------------------------------

def test_the_docker_socket_default_is_written_once():
    """Modules (plugins/modules/, plugins/module_utils/) keep their documented option default for direct use: every role
    and playbook passes docker_socket from the plan. Everywhere else the literal is the one default's."""
    found = [(_rel(p), n) for p in _files(*ANSIBLE, *PYTHON, "plugins/plugin_utils/data/*.yml")
             for n, line in enumerate(_read(p).splitlines(), 1) if SOCKET in line]
    assert [path for path, _ in found] == ["plugins/plugin_utils/data/variables.yml"], found
    assert inventory.shared_default("pd_docker_socket") == SOCKET


def test_no_role_or_playbook_defaults_the_socket_variable_itself():
    found = [_rel(p) for p in _files(*ANSIBLE) if re.search(r"pd_docker_socket\s*\|\s*default", _read(p))]
    assert found == []


def test_every_role_declares_its_socket_option_as_the_plans():
    for role in ("pd_container", "pd_ops", "pd_prechecks", "pd_rollout"):
        defaults = yaml.safe_load(_read(os.path.join(REPO, "roles", role, "defaults", "main.yml")))
        specs = yaml.safe_load(_read(os.path.join(REPO, "roles", role, "meta", "argument_specs.yml")))
        name = f"{role}_docker_socket"
        assert ".docker_socket" in defaults[name] and "hosts[inventory_hostname]" in defaults[name], role
        for entry, spec in specs["argument_specs"].items():
            if name in (spec.get("options") or {}):
                assert spec["options"][name]["default"] == defaults[name], (role, entry)


#: pd-deploy's modules that talk to the Docker API (pd_host_check through pd_host_probe); their documented option
#: default serves direct use only.
DOCKER_MODULES = ("pd_host_probe", "pd_host_check", "pd_container_logs", "pd_container_start", "pd_http_wait",
                  "pd_proxy_drain")


def test_every_call_of_a_docker_module_passes_the_socket():
    """So that the modules' own option default never decides which socket a role or playbook uses."""
    missing, calls = [], 0
    for path in _files("roles/*/tasks/*.yml", "playbooks/*.yml"):
        for task in _tasks(yaml.safe_load(_read(path))):
            for module in (key for name in DOCKER_MODULES for key in (name, f"pd.deploy.{name}")):
                if module in task:
                    calls += 1
                    if "docker_socket" not in (task[module] or {}):
                        missing.append(f"{_rel(path)}: {task.get('name')}")
    assert calls > 10 and missing == []


def test_the_plan_carries_each_hosts_socket_with_the_one_default():
    plan = fleet.plan_fleet(example_fleet())
    assert plan["ok"], plan["messages"]
    assert {h["docker_socket"] for h in plan["hosts"].values()} == {SOCKET}
    custom = example_fleet()
    custom["hosts"][1]["vars"]["pd_docker_socket"] = "/run/user/1000/docker.sock"
    plan = fleet.plan_fleet(custom)
    assert plan["hosts"]["a-d0"]["docker_socket"] == "/run/user/1000/docker.sock"
    assert plan["hosts"]["a-p0"]["docker_socket"] == SOCKET


def test_a_relative_socket_is_refused_with_the_default_as_example():
    bad = example_fleet()
    bad["hosts"][0]["vars"]["pd_docker_socket"] = "docker.sock"
    plan = fleet.plan_fleet(bad)
    msgs = [m for m in plan["messages"] if "pd_docker_socket" in m]
    assert not plan["ok"] and msgs and SOCKET in msgs[0], plan["messages"]


# ---- the build directory ------------------------------------------------------------------------

BUILD_DEFAULT = {"roles/pd_plan/defaults/main.yml", "roles/pd_plan/meta/argument_specs.yml"}


def test_the_build_directory_is_spelled_out_once():
    found = {_rel(p) for p in _files(*ANSIBLE)
             if re.search(r"pd_inventory_slug|/\.\./build|'/build/'", _read(p))}
    assert found == BUILD_DEFAULT


def test_the_plan_publishes_the_build_directory_and_every_output_dir_reads_it():
    tasks = yaml.safe_load(_read(os.path.join(REPO, "roles", "pd_plan", "tasks", "main.yml")))
    # the first task (pd_plan_make) publishes the plan and the build directory on localhost
    assert tasks[0]["pd.deploy.pd_plan_make"]["plan"] and tasks[0]["delegate_facts"] is True
    from ansible_collections.pd.deploy.plugins.action import pd_plan_make
    made = pd_plan_make.facts({"pd_plan_report_failure": False, "pd_plan_build_dir": "/tmp/x"}, {"ok": True}, [], 1)
    assert set(made) == {"pd_plan_fleet", "pd_plan_build_dir", "pd_plan_problem"}
    readers = {_rel(p) for p in _files(*ANSIBLE) if "hostvars['localhost'].pd_plan_build_dir" in _read(p)}
    for book in ("baseline", "capacity_report", "collect_logs", "deploy_pd", "health_check", "monitoring",
                 "token_gate", "tune"):
        assert f"playbooks/{book}.yml" in readers, book
    assert "roles/pd_ops/defaults/main.yml" in readers


# ---- private variables --------------------------------------------------------------------------

PRIVATE = re.compile(r"(?<![\w])_{1,2}pd_[a-z0-9_]+")


def owner(name):
    """The role a private variable belongs to (``_pd_<role>_*``), or None for a local name (_pd_old)."""
    bare = name.lstrip("_")
    for role in sorted(ROLES, key=len, reverse=True):
        if bare.startswith(role + "_"):
            return role
    return None


def foreign_private_reads():
    out = []
    for path in _files(*ANSIBLE, "molecule/**/*.yml"):
        rel = _rel(path)
        here = rel.split("/")[1] if rel.startswith("roles/") else None
        for n, line in enumerate(_read(path).splitlines(), 1):
            for name in PRIVATE.findall(line):
                role = owner(name)
                if role and role != here:
                    out.append(f"{rel}:{n}: {name} (private to {role})")
    return out


def test_the_owner_of_a_private_name_is_its_role_prefix():
    assert owner("_pd_container_plan") == "pd_container"
    assert owner("__pd_prechecks_probe") == "pd_prechecks"
    assert owner("_pd_old") is None and owner("_pd_tune_plan") is None


def test_no_role_or_playbook_reads_another_roles_private_variables():
    assert foreign_private_reads() == []


# ---- logic in filters ---------------------------------------------------------------------------

def test_no_jinja_statements_in_roles_or_playbooks():
    found = [f"{_rel(p)}:{n}" for p in _files(*ANSIBLE)
             for n, line in enumerate(_read(p).splitlines(), 1) if "{%" in line]
    assert found == []


def test_batch_probes_keeps_the_container_lists_of_the_hosts_given():
    probes = [{"containers": [{"name": "r0", "running": True}], "image_refs": {"i": {}}}, {"containers": []}]
    first = order.batch_probes(["h1", "h2"], probes)
    assert first == {"h1": {"containers": [{"name": "r0", "running": True}]}, "h2": {"containers": []}}
    assert order.batch_probes(["h1", "h2"], probes) == first  # pure: same answer twice
    assert probes[0]["image_refs"] == {"i": {}}  # input untouched
    assert order.batch_probes(["h1"], [None]) == {"h1": {"containers": []}}


@pytest.mark.parametrize("hosts, probes, field", [
    ("h1", [{}], "hosts"),
    (["h1", "h2"], [{}], "probes"),
    (["h1"], [{"containers": "r0"}], "probes[h1].containers"),
])
def test_batch_probes_refuses_bad_input_naming_the_field(hosts, probes, field):
    with pytest.raises(PdError) as err:
        order.batch_probes(hosts, probes)
    assert err.value.field == field and "pd_batch_probes" in str(err.value)


def test_the_batch_probes_feed_the_rollout_waves():
    plan = fleet.plan_fleet(example_fleet())
    hosts = plan["clusters"]["cluster_a"]["hosts"]
    probes = order.batch_probes(hosts, [{"containers": []} for _ in hosts])
    waves = order.rollout_waves(plan, "cluster_a", "all", probes)
    assert waves and not [w for w in waves if w["drain"]]  # nothing runs: one start wave, no drain


# ---- entry points -------------------------------------------------------------------------------

def _tasks(node):
    """Every task of a play list or task list, blocks opened."""
    out = []
    for item in node or []:
        if not isinstance(item, dict):
            continue
        out.append(item)
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            out.extend(_tasks(item.get(key)))
    return out


def role_calls():
    """(file, role, entry point, {var: value}) of every include_role / import_role in roles and playbooks."""
    out = []
    for path in _files("roles/*/tasks/*.yml", "playbooks/*.yml"):
        for task in _tasks(yaml.safe_load(_read(path))):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"):
                if key in task:
                    args = task[key]
                    out.append((_rel(path), args["name"].removeprefix("pd.deploy."), args.get("tasks_from", "main"), task.get("vars") or {}))
    return out


def _specs(role):
    return yaml.safe_load(_read(os.path.join(REPO, "roles", role, "meta", "argument_specs.yml")))["argument_specs"]


def test_every_entry_point_used_is_declared_and_called_with_its_options():
    calls = role_calls()
    assert ("playbooks/collect_logs.yml", "pd_container", "read_logs") in [c[:3] for c in calls]
    problems = []
    for where, role, entry, passed in calls:
        specs = _specs(role)
        if entry not in specs:
            problems.append(f"{where}: {role} tasks_from {entry} has no entry point in meta/argument_specs.yml")
            continue
        options = specs[entry].get("options") or {}
        for name in passed:
            if name.startswith(f"{role}_") and name not in options:
                problems.append(f"{where}: {role}/{entry}: {name} is not an option of the entry point")
        for name, option in options.items():
            if option.get("required") and name not in passed:
                problems.append(f"{where}: {role}/{entry}: required option {name} not passed")
    assert problems == []


def test_entry_point_options_are_role_defaults_or_required():
    for role in ROLES:
        defaults = yaml.safe_load(_read(os.path.join(REPO, "roles", role, "defaults", "main.yml"))) or {}
        for entry, spec in _specs(role).items():
            for name, option in (spec.get("options") or {}).items():
                assert name.startswith(f"{role}_"), (role, entry, name)
                assert option.get("required") is True or option.get("default") == defaults.get(name), (role, entry, name)


# ---- operations read the plan -------------------------------------------------------------------

#: tune.yml compares the pd_cluster the operator recorded with the one edited (pd_one_change only counts
#: a value either side states), so it reads what was written, on purpose; everything else reads the plan.
RAW_CLUSTER_READERS = {"playbooks/tune.yml"}


def test_operations_read_the_normalized_clusters_from_the_plan():
    found = set()
    for path in _files("roles/*/tasks/*.yml", "roles/*/vars/*.yml", "roles/*/defaults/*.yml", "playbooks/*.yml"):
        code = "\n".join(line for line in _read(path).splitlines() if not line.strip().startswith("#"))
        if re.search(r"\bpd_cluster\b(?!_)", code) or "pd_normalized_cluster" in code:
            found.add(_rel(path))
    assert found == RAW_CLUSTER_READERS


def test_the_plan_carries_each_clusters_normalized_config():
    plan = fleet.plan_fleet(example_fleet())
    config = plan["clusters"]["cluster_a"]["config"]
    assert config["name"] == "cluster_a" and set(config["roles"]) == {"prefill", "decode"}
    assert config["roles"]["prefill"]["cpu_offload_bytes"] == 200 * 2**30  # sizes in bytes
    assert isinstance(config["workload"]["avg_prompt_tokens"], int)
