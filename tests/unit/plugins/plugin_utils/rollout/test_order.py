"""rollout.order.entry_options: one argument check for a role and the roles it runs."""

import os

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.rollout.order import entry_options
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))))


def _spec(**options):
    return {"argument_specs": {"main": {"options": options}, "other": {"options": {"x_only_other": {"type": "str"}}}}}


def test_merges_main_options_of_every_role_without_the_passed_ones():
    merged = entry_options([_spec(a_one={"type": "int"}, a_two={"type": "str"}), _spec(b_one={"type": "bool"})],
                           ["a_two"])
    assert merged == {"a_one": {"type": "int"}, "b_one": {"type": "bool"}}  # other entry points stay out


def test_a_role_without_options_or_a_main_entry_adds_nothing():
    assert entry_options([None, {"argument_specs": {}}, {"argument_specs": {"main": {}}}]) == {}


def test_an_option_declared_twice_the_same_way_is_one_option():
    assert entry_options([_spec(s={"type": "str"}), _spec(s={"type": "str"})]) == {"s": {"type": "str"}}


def test_an_option_declared_twice_differently_is_refused_by_name():
    with pytest.raises(PdError) as err:
        entry_options([_spec(s={"type": "str"}), _spec(s={"type": "int"})])
    assert "s: declared by two of the roles, differently" in str(err.value)


def test_the_rollout_roles_merge_cleanly_and_keep_every_option_they_do_not_pass():
    roles = ("pd_rollout", "pd_engine", "pd_proxy", "pd_container")
    specs = []
    for role in roles:
        with open(os.path.join(REPO, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
            specs.append(yaml.safe_load(handle))
    with open(os.path.join(REPO, "roles", "pd_rollout", "vars", "main.yml"), encoding="utf-8") as handle:
        passed = yaml.safe_load(handle)["_pd_rollout_passed_options"]
    merged = entry_options(specs, passed)
    declared = {n for s in specs for n in s["argument_specs"]["main"].get("options", {})}
    assert set(merged) == declared - set(passed) and merged
