"""Every module and every action plugin has a page that ansible-doc renders (issue 22, item 4).

An operator debugging a failed task runs ``ansible-doc pd.deploy.<module>``; a DOCUMENTATION block that
is not valid YAML (a ``: `` inside a plain sentence) made that fail for pd_host_probe and pd_proxy_drain,
and the action-only pd_write_files had no page at all. ansible-doc is run once for all of them.
"""

import ast
import json
import os
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(REPO, "plugins", "modules")
ACTIONS = os.path.join(REPO, "plugins", "action")
MODULES = sorted(f[:-3] for f in os.listdir(LIBRARY) if f.endswith(".py") and not f.startswith("_"))
ACTION_PLUGINS = sorted(f[:-3] for f in os.listdir(ACTIONS) if f.endswith(".py") and not f.startswith("_"))
# ansible-test validate-modules wants "Name (@github_handle)" or "Name (!UNKNOWN)"
AUTHOR_SUFFIXES = ("(!UNKNOWN)", ")")


def _blocks(name):
    """{DOCUMENTATION, EXAMPLES, RETURN: text} of plugins/modules/<name>.py, read without importing it."""
    with open(os.path.join(LIBRARY, f"{name}.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                out[node.targets[0].id] = node.value.value
    return out


def test_every_action_plugin_has_a_module_page():
    missing = [name for name in ACTION_PLUGINS if name not in MODULES]
    assert not missing, (f"plugins/action/{missing}: no plugins/modules/<name>.py holding its DOCUMENTATION, EXAMPLES "
                         "and RETURN (ansible-doc finds an action's page there)")


@pytest.mark.parametrize("name", MODULES)
def test_doc_blocks_parse_and_name_the_module(name):
    blocks = _blocks(name)
    assert set(blocks) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, f"plugins/modules/{name}.py: has only {sorted(blocks)}"
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    assert doc["module"] == name
    assert doc["short_description"] and doc["description"]
    authors = doc["author"] if isinstance(doc["author"], list) else [doc["author"]]
    assert all(a.strip().endswith(AUTHOR_SUFFIXES) and "(" in a for a in authors), authors
    for option, spec in (doc.get("options") or {}).items():
        assert spec.get("description") and spec.get("type"), f"{name}: option {option} needs a description and a type"
    examples = yaml.safe_load(blocks["EXAMPLES"])
    assert isinstance(examples, list) and all(f"pd.deploy.{name}" in task for task in examples), \
        f"plugins/modules/{name}.py: every EXAMPLES task calls pd.deploy.{name}"
    for key, spec in yaml.safe_load(blocks["RETURN"]).items():
        assert spec.get("description") and spec.get("type") and spec.get("returned"), f"{name}: RETURN {key}"


def test_ansible_doc_renders_every_module():
    doc = os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    # from the checkout: ansible.cfg's collections_path finds the collection pd.deploy (collections/)
    result = subprocess.run([doc, "--json", *(f"pd.deploy.{name}" for name in MODULES)], cwd=REPO, capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ERROR" not in result.stderr, result.stderr
    pages = json.loads(result.stdout)
    assert sorted(pages) == [f"pd.deploy.{name}" for name in MODULES]
    for name, page in pages.items():
        assert page["doc"]["module"] == name.split(".")[-1] and page["examples"] and page["return"], name
