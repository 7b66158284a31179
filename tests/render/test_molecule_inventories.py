"""Every Molecule scenario's inventory passes validate.yml, checked in seconds without Docker.

The scenarios are ordinary pd-deploy inventories; a rule added to the validator that one of them
breaks used to surface only inside that scenario's Molecule run (CI's real-engine failed that way
after the fail-closed rules: two simulated hosts on one address claimed the same NPUs, and its
test-only variables still carried the pd_ prefix the validator refuses).
"""

import os
import re

import pytest
import yaml

from pd_render_helpers import REPO, assert_no_traceback, run_playbooks

pytestmark = pytest.mark.ansible

SCENARIOS = sorted(
    name for name in os.listdir(os.path.join(REPO, "molecule"))
    if os.path.isfile(os.path.join(REPO, "molecule", name, "inventory", "hosts.yml"))
)


def test_every_scenario_with_an_inventory_is_checked():
    assert "real-engine" in SCENARIOS and "default" in SCENARIOS, SCENARIOS


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ansible_home):
    build = tmp_path_factory.mktemp("molecule-inventories")
    return run_playbooks({
        name: ["playbooks/validate.yml", "-i", os.path.join(REPO, "molecule", name, "inventory"),
               "-e", f"pd_plan_build_dir={build}/{name}"]
        for name in SCENARIOS
    }, ansible_home)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_inventory_validates(runs, scenario):
    run = runs[scenario]
    assert_no_traceback(run)
    assert run.rc == 0, str(run)


def _lanes():
    """The lanes of scenarios tests/harness/run-molecule.sh runs at the same time by default."""
    text = open(os.path.join(REPO, "tests", "harness", "run-molecule.sh")).read()
    found = re.search(r'\$\{PD_MOLECULE_LANES-([^}]*)\}', text)
    assert found, "run-molecule.sh no longer names its default lanes as ${PD_MOLECULE_LANES-...}"
    return [lane.split() for lane in found.group(1).split(";")]


def _all_scenarios():
    return sorted(name for name in os.listdir(os.path.join(REPO, "molecule"))
                  if os.path.isfile(os.path.join(REPO, "molecule", name, "molecule.yml")))


def _port_blocks(scenario):
    """The blocks of 100 ports a scenario's inventory and molecule.yml name (HTTP, KV, DP RPC, proxy, HCCL)."""
    blocks = set()
    for root, _, files in os.walk(os.path.join(REPO, "molecule", scenario)):
        for name in files:
            if name.endswith((".yml", ".yaml")):
                text = open(os.path.join(root, name)).read()
                blocks |= {int(v) // 100 for v in re.findall(r'(?m)^\s*\w*port\w*:\s*"?(\d{4,5})\b', text)}
    return blocks


def _names(scenario):
    """The simulated hosts (Molecule platforms, else the base config's) and cluster names of a scenario:
    the containers it creates and removes are named after them (molecule/shared/tasks/remove-siblings.yml)."""
    def platforms(path):
        return [p["name"] for p in (yaml.safe_load(open(path)) or {}).get("platforms") or []]

    hosts = (platforms(os.path.join(REPO, "molecule", scenario, "molecule.yml"))
             or platforms(os.path.join(REPO, ".config", "molecule", "config.yml")))
    clusters = set()
    for root, _, files in os.walk(os.path.join(REPO, "molecule", scenario, "inventory")):
        for name in files:
            if name.endswith((".yml", ".yaml")):
                data = yaml.safe_load(open(os.path.join(root, name))) or {}
                if isinstance(data, dict) and isinstance(data.get("pd_cluster"), dict):
                    clusters.add(data["pd_cluster"]["name"])
    return {f"host {h}" for h in hosts} | {f"cluster {c}" for c in clusters}


def test_every_scenario_is_in_one_lane():
    lanes = _lanes()
    named = [s for lane in lanes for s in lane]
    assert len(lanes) > 1, lanes
    assert sorted(named) == _all_scenarios(), f"lanes {lanes} vs scenarios {_all_scenarios()}"


def test_scenarios_of_different_lanes_share_no_port_host_or_cluster():
    # the lanes run at the same time on the same loopback and Docker daemon: a shared port makes one
    # scenario's engines answer the other's checks (CI's real-engine once failed that way beside ops,
    # both on 21xxx), a shared host or cluster name makes one scenario remove the other's containers
    lanes = _lanes()
    for i, lane in enumerate(lanes):
        for s in lane:
            ports, names = _port_blocks(s), _names(s)
            assert ports, f"{s}: no port found"
            for other in (o for later in lanes[i + 1:] for o in later):
                shared = sorted(ports & _port_blocks(other))
                assert not shared, f"{s} and {other} run at the same time and both use ports {[b * 100 for b in shared]}..+99"
                both = sorted(names & _names(other))
                assert not both, f"{s} and {other} run at the same time and both name {both}"
