"""Every Molecule scenario's inventory passes validate.yml, checked in seconds without Docker.

The scenarios are ordinary pd-deploy inventories; a rule added to the validator that one of them
breaks used to surface only inside that scenario's Molecule run (CI's real-engine failed that way
after the fail-closed rules: two simulated hosts on one address claimed the same NPUs, and its
test-only variables still carried the pd_ prefix the validator refuses).
"""

import os
import re

import pytest

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


def _side_lane():
    """The scenarios tests/harness/run-molecule.sh runs beside the others by default."""
    text = open(os.path.join(REPO, "tests", "harness", "run-molecule.sh")).read()
    found = re.search(r'\$\{PD_MOLECULE_SIDE_LANE-([^}]*)\}', text)
    assert found, "run-molecule.sh no longer names its default side lane as ${PD_MOLECULE_SIDE_LANE-...}"
    return found.group(1).split()


def _port_blocks(scenario):
    """The blocks of 100 ports a scenario's inventory and molecule.yml name (HTTP, KV, DP RPC, proxy)."""
    blocks = set()
    for root, _, files in os.walk(os.path.join(REPO, "molecule", scenario)):
        for name in files:
            if name.endswith((".yml", ".yaml")):
                text = open(os.path.join(root, name)).read()
                blocks |= {int(v) // 100 for v in re.findall(r'(?m)^\s*\w*port\w*:\s*"?(\d{4,5})\b', text)}
    return blocks


def test_side_lane_scenarios_share_no_port_with_the_others():
    # the side lane runs at the same time as every other scenario on the same loopback: a shared port
    # makes one scenario's engines answer the other's checks (CI's real-engine once failed that way
    # beside ops, both on 21xxx)
    side = _side_lane()
    assert side and all(s in SCENARIOS for s in side), side
    for s in side:
        mine = _port_blocks(s)
        assert mine, f"{s}: no port found"
        for other in set(os.listdir(os.path.join(REPO, "molecule"))) - {s, "shared"}:
            if os.path.isdir(os.path.join(REPO, "molecule", other)):
                shared = sorted(mine & _port_blocks(other))
                assert not shared, f"{s} and {other} both use ports {[b * 100 for b in shared]}..+99"
