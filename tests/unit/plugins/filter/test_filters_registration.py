"""plugins/filter/pd.py: every core filter is registered under a pd_ name, and works through real
Ansible templating with the types it promises."""

import inspect
import os

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils import ops
from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import bootstrap, compat, netchecks, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.ops import logparse
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity, connectors, fleet, versions
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers, failures, order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import registry, rules, secrets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
# ops is registered as one mapping; its steps are listed one by one so a name two steps claim is caught
MODULES = (sizes, capacity, logparse, versions, connectors, rules, fleet, order, containers, report, prechecks, secrets,
           *ops.STEPS, netchecks, failures, compat, registry, bootstrap)
GIB = 1024 ** 3


def load_plugin():
    """plugins/filter/pd.py, imported under the collection's name."""
    from ansible_collections.pd.deploy.plugins.filter import pd
    return pd


PLUGIN = load_plugin()
FILTERS = PLUGIN.FilterModule().filters()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_module_filter_is_registered_as_the_same_function(module):
    assert module.FILTERS, f"{module.__name__} exports no filters"
    for name, func in module.FILTERS.items():
        assert FILTERS.get(name) is func, f"{name} of {module.__name__} is not registered"


def test_no_two_modules_claim_the_same_filter_name():
    names = [n for m in MODULES for n in m.FILTERS] + ["pd_fleet_input", "pd_plan_from_hostvars"]
    assert len(names) == len(set(names))
    assert set(FILTERS) == set(names)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_is_a_pd_named_documented_callable(name):
    func = FILTERS[name]
    assert name.startswith("pd_")
    assert callable(func)
    assert (inspect.getdoc(func) or "").strip(), f"{name} has no docstring"


def test_filters_returns_a_fresh_mapping():
    first = PLUGIN.FilterModule().filters()
    first["pd_to_bytes"] = None
    assert PLUGIN.FilterModule().filters()["pd_to_bytes"] is sizes.to_bytes


def test_fleet_input_reads_only_pd_variables_from_hostvars():
    hostvars = {"h1": {"pd_cluster": {"name": "c"}, "pd_npus": 8, "ansible_host": "10.0.0.1",
                       "group_names": ["c", "prefill"], "secret_password": "x"}}
    got = PLUGIN.fleet_input(hostvars, ["h1"], limit=("h1",))
    assert got == {"hosts": [{"name": "h1", "groups": ["c", "prefill"],
                              "vars": {"pd_cluster": {"name": "c"}, "pd_npus": 8, "ansible_host": "10.0.0.1"},
                              "keys": ["pd_cluster", "pd_npus"]}],
                   "limit": ["h1"]}


# ---- through Ansible's own templating -----------------------------------------------------------

@pytest.fixture(scope="module")
def templar():
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    # pd.deploy.* resolves through the collection loader tests/conftest.py installed
    return Templar(loader=DataLoader(), variables={"offload": "200GiB", "npus": 8})


def render(templar, text):
    from ansible.template import trust_as_template

    return templar.template(trust_as_template(text))


@pytest.mark.ansible
def test_split_per_rank_through_ansible_gives_an_int(templar):
    value = render(templar, "{{ offload | pd.deploy.pd_split_per_rank(npus) }}")
    assert value == 200 * GIB // 8 == 26843545600
    assert type(value) is int
    assert render(templar, '{{ "200GiB" | pd.deploy.pd_split_per_rank(8) | type_debug }}') == "int"


@pytest.mark.ansible
def test_to_bytes_through_ansible_supports_arithmetic(templar):
    assert render(templar, '{{ ("1.5GiB" | pd.deploy.pd_to_bytes) + 1 }}') == 3 * GIB // 2 + 1
    assert render(templar, '{{ {"shm": "256gib" | pd.deploy.pd_to_bytes, "human": 274877906944 | pd.deploy.pd_to_human} }}') == {
        "shm": 256 * GIB, "human": "256GiB"}


@pytest.mark.ansible
def test_a_bad_value_through_ansible_is_a_readable_error_naming_the_filter(templar):
    with pytest.raises(Exception) as info:
        render(templar, '{{ "200GiB" | pd.deploy.pd_split_per_rank(7) }}')
    text = str(info.value)
    assert "pd_split_per_rank: total:" in text
    assert "does not divide over 7 ranks" in text
    assert "Traceback" not in text
