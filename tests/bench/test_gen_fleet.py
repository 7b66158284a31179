"""bench/gen_fleet.py writes an inventory that the project's planner accepts without an error.

The fleet dict handed to plugin_utils.fleet.plan_fleet is rebuilt here from the generated YAML files
(hosts.yml, group_vars/, host_vars/), the way Ansible would merge them, so the test checks the files
on disk rather than the generator's own data.
"""

import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from bench import gen_fleet  # noqa: E402  (bench/ is a plain folder of the checkout, pythonpath ".")


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def _walk(name, group, parents, out, order):
    """Collect {host: set(groups)} and first-seen host order from an Ansible YAML inventory group."""
    lineage = parents + [name]
    for host in (group or {}).get("hosts") or {}:
        out.setdefault(host, set()).update(lineage)
        if host not in order:
            order.append(host)
    for child, body in ((group or {}).get("children") or {}).items():
        _walk(child, body, lineage, out, order)


def fleet_from_files(directory):
    """The plain {"hosts": [{name, groups, vars}]} fleet of plugin_utils.fleet from the inventory files."""
    inventory = _read(os.path.join(directory, "hosts.yml"))
    groups, order = {}, []
    _walk("all", inventory["all"], [], groups, order)
    all_vars = inventory["all"].get("vars") or {}
    cluster_hosts = [h for h in order if "pd_clusters" in groups[h]]
    hosts = []
    for name in cluster_hosts:
        merged = dict(all_vars)
        for group in sorted(groups[name]):
            path = os.path.join(directory, "group_vars", f"{group}.yml")
            if os.path.exists(path):
                merged.update(_read(path))
        merged.update(_read(os.path.join(directory, "host_vars", f"{name}.yml")))
        hosts.append({"name": name, "groups": sorted(groups[name] - {"all"}), "vars": merged})
    return {"hosts": hosts, "limit": None}


@pytest.mark.parametrize("clusters", [1, 4])
def test_generated_fleet_plans_without_errors(tmp_path, clusters):
    names = gen_fleet.write_fleet(str(tmp_path), clusters, prefill_hosts=2, decode_hosts=2)
    data = fleet_from_files(str(tmp_path))

    assert [h["name"] for h in data["hosts"]] == names
    assert len(names) == 4 * clusters
    plan = fleet.plan_fleet(data)

    errors = [v for v in plan["violations"] if v["level"] == "error"]
    assert errors == [], plan["messages"]
    assert plan["ok"]
    assert sorted(plan["clusters"]) == [gen_fleet.cluster_name(c) for c in range(clusters)]
    # one cluster per rollout batch; DP2 x TP4 on 8 NPUs = 2 engine ranks on every host
    assert plan["batches"] == [4] * clusters
    assert all(len(h["specs"]) == 2 for h in plan["hosts"].values())
    assert sum(1 for h in plan["hosts"].values() if h["proxy"]) == clusters


def test_generated_hosts_are_local_and_distinct(tmp_path):
    gen_fleet.write_fleet(str(tmp_path), 3, prefill_hosts=1, decode_hosts=3, python="/opt/py/bin/python3")
    data = fleet_from_files(str(tmp_path))

    assert all(h["vars"]["ansible_connection"] == "local" for h in data["hosts"])
    assert all(h["vars"]["ansible_python_interpreter"] == "/opt/py/bin/python3" for h in data["hosts"])
    addresses = [h["vars"]["pd_host_address"] for h in data["hosts"]]
    assert len(set(addresses)) == len(addresses) == 12
    assert all(a.startswith("127.") for a in addresses)
    assert fleet.plan_fleet(data)["ok"]


def test_empty_fleet_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must each be >= 1"):
        gen_fleet.write_fleet(str(tmp_path), 0)


@pytest.mark.ansible
def test_generated_fleet_passes_validate_playbook(tmp_path):
    inventory = tmp_path / "inventory"
    gen_fleet.write_fleet(str(inventory), 1)
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    run = subprocess.run(
        [ansible_playbook, "playbooks/validate.yml", "-i", str(inventory),
         "-e", f"pd_plan_build_dir={tmp_path / 'build'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default"))

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "build" / "render" / "bench_c000" / "capacity.md").exists()
