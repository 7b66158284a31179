"""plugin_utils.datafiles: each data file is parsed once, yet every caller gets its own copy."""

import json
import os

import pytest
import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.shared import datafiles

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
DATA = sorted(n for n in os.listdir(os.path.join(REPO, "plugins", "plugin_utils", "data")) if n.endswith(".yml"))
SCHEMAS = sorted(n for n in os.listdir(os.path.join(REPO, "plugins", "plugin_utils", "schemas")) if n.endswith(".json"))


def _poke(value):
    """Change something inside ``value`` in place (the first mutable container found)."""
    if isinstance(value, dict):
        key = next(iter(value))
        if isinstance(value[key], (dict, list)) and value[key]:
            _poke(value[key])
        else:
            value[key] = "changed by a caller"
    elif isinstance(value, list):
        value.append("changed by a caller")


@pytest.mark.parametrize("name", DATA)
def test_yaml_data_is_the_file_and_a_caller_cannot_change_the_next_answer(name):
    with open(os.path.join(REPO, "plugins", "plugin_utils", "data", name), encoding="utf-8") as handle:
        expected = yaml.safe_load(handle)
    first = datafiles.yaml_data(name)
    assert first == expected
    _poke(first)
    assert first != expected
    assert datafiles.yaml_data(name) == expected


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_is_the_file_and_a_caller_cannot_change_the_next_answer(name):
    with open(os.path.join(REPO, "plugins", "plugin_utils", "schemas", name), encoding="utf-8") as handle:
        expected = json.load(handle)
    first = datafiles.schema(name)
    assert first == expected
    _poke(first)
    assert datafiles.schema(name) == expected
