"""The one documented list of pd_* variables (plugins/plugin_utils/data/variables.yml) stays complete and alive:
the validator refuses every pd_* host variable that is not a host fact, a role default or on that list,
so a playbook variable missing from it would be refused when an operator sets it."""

import glob
import os

import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.validate import inventory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))


def play_vars():
    for path in sorted(glob.glob(os.path.join(REPO, "playbooks", "*.yml"))):
        with open(path, encoding="utf-8") as handle:
            for play in yaml.safe_load(handle) or []:
                for name in (play.get("vars") or {}):
                    yield os.path.basename(path), name


def test_every_public_play_variable_is_known():
    known = inventory.known_variables()
    missing = [(book, name) for book, name in play_vars() if name.startswith("pd_") and name not in known]
    assert missing == []


def test_every_documented_variable_is_used_somewhere():
    text = ""
    for pattern in ("playbooks/*.yml", "roles/*/*/*.yml", "plugins/plugin_utils/**/*.py", "inventories/*/hosts.yml",
                    "plugins/action/*.py"):
        for path in glob.glob(os.path.join(REPO, pattern), recursive=True):
            with open(path, encoding="utf-8") as handle:
                text += handle.read()
    unused = [name for name in inventory.documented_variables() if name not in text]
    assert unused == []


def test_documented_variables_do_not_shadow_host_facts_or_role_defaults():
    documented = set(inventory.documented_variables())
    assert documented & set(inventory.HOST_FACTS) == set()
    assert documented & inventory.role_defaults() == set()
