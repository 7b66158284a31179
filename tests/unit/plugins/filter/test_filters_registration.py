"""plugins/filter/pd.py: the public filters map pd_ names to the core's functions, and work through real
Ansible templating with the types they promise; the core's other functions are not filters (which ones
are public: test_filter_docs.py)."""

import inspect
import os

import pytest

from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
CORE = "ansible_collections.pd.deploy.plugins.plugin_utils."
GIB = 1024 ** 3


def load_plugin():
    """plugins/filter/pd.py, imported under the collection's name."""
    from ansible_collections.pd.deploy.plugins.filter import pd
    return pd


PLUGIN = load_plugin()
FILTERS = PLUGIN.FilterModule().filters()


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_is_a_function_of_the_core_or_the_hostvars_adapter(name):
    func = FILTERS[name]
    assert func.__module__.startswith(CORE) or func is PLUGIN.plan_from_hostvars, (name, func.__module__)
    assert getattr(inspect.getmodule(func), func.__name__) is func, f"{name}: not a module-level function"


def test_the_core_modules_register_nothing_themselves():
    # the public surface is the one list in plugins/filter/pd.py, not whatever a module exports
    from ansible_collections.pd.deploy.plugins.plugin_utils.ops import diagnosis
    from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity
    for module in (sizes, capacity, diagnosis):
        assert not hasattr(module, "FILTERS"), module.__name__


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
    # not a filter itself: the first half of pd_plan_from_hostvars
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
def test_to_bytes_through_ansible_gives_an_int(templar):
    value = render(templar, "{{ offload | pd.deploy.pd_to_bytes }}")
    assert value == 200 * GIB == 214748364800
    assert type(value) is int
    assert render(templar, '{{ "200GiB" | pd.deploy.pd_to_bytes | type_debug }}') == "int"


@pytest.mark.ansible
def test_to_bytes_through_ansible_supports_arithmetic(templar):
    assert render(templar, '{{ ("1.5GiB" | pd.deploy.pd_to_bytes) + 1 }}') == 3 * GIB // 2 + 1
    assert render(templar, '{{ {"shm": "256gib" | pd.deploy.pd_to_bytes, "npus": npus} }}') == {
        "shm": 256 * GIB, "npus": 8}


@pytest.mark.ansible
def test_a_bad_value_through_ansible_is_a_readable_error_naming_the_filter(templar):
    with pytest.raises(Exception) as info:
        render(templar, '{{ "200G" | pd.deploy.pd_to_bytes }}')
    text = str(info.value)
    assert "pd_to_bytes: size:" in text
    assert "Traceback" not in text


@pytest.mark.ansible
@pytest.mark.parametrize("private", ["pd_split_per_rank", "pd_to_human", "pd_kv_budget", "pd_fleet_input"])
def test_a_core_function_that_no_role_uses_is_no_filter(templar, private):
    assert private not in FILTERS
    with pytest.raises(Exception, match=f"pd.deploy.{private}"):
        render(templar, '{{ "200GiB" | pd.deploy.%s(8) }}' % private)
