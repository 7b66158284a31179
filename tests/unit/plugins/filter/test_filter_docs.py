"""The public filters are exactly the used ones, each with a checked-in ansible-doc page:
plugins/filter/<name>.yml (issue 22, item 4).

Public = applied by a role, a playbook, a Molecule scenario or the docs; a filter nothing applies is
not exported (it stays a plain function of plugins/plugin_utils, which its tests call directly). Each
public filter needs a page with real types (never ``raw``) and examples, whose options are the
function's own parameters. ansible-doc finds
the pages through ansible.cfg's ``filter_plugins`` path: ``ansible-doc -t filter pd_to_bytes``.
"""

import functools
import glob
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
PLUGIN_DIR = os.path.join(REPO, "plugins", "filter")
TYPES = {"str", "int", "float", "bool", "list", "dict", "path"}
# where filters are used; docs/ counts too (a filter an operator is told to use is public)
USE_GLOBS = ("roles/**/*.yml", "roles/**/*.j2", "playbooks/**/*.yml", "molecule/**/*.yml", "*.yml", "docs/**/*.md")


def _filters():
    """Every filter of the collection: plugins/filter/pd.py and pd_paths.py."""
    from ansible_collections.pd.deploy.plugins.filter import pd, pd_paths
    return {**pd.FilterModule().filters(), **pd_paths.FilterModule().filters()}


FILTERS = _filters()
DOCS = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(PLUGIN_DIR, "*.yml")))


@functools.lru_cache(maxsize=None)
def used_filters():
    """Filter names applied in the repository's YAML, templates and docs: ``| name`` or ``map('name'``."""
    texts = []
    for pattern in USE_GLOBS:
        for path in glob.glob(os.path.join(REPO, pattern), recursive=True):
            with open(path, encoding="utf-8") as handle:
                texts.append(handle.read())
    # one pass over the text (a search per filter took seconds): every word after a pipe, every quoted
    # name of a map/select/reject, kept when it is one of the plugin's filters
    text = "\n".join(texts)
    applied = set(re.findall(r"\|\s*(?:pd\.deploy\.)?(\w+)", text)) | set(
        re.findall(r"\b(?:map|select|reject)\(\s*['\"](?:pd\.deploy\.)?(\w+)['\"]", text))
    return tuple(sorted(name for name in FILTERS if name in applied))


def test_the_use_scan_finds_filters():
    used = used_filters()
    assert "pd_plan_from_hostvars" in used and "pd_baseline_spec" in used  # a pipe and a map('...') use
    assert len(used) > 40, used


def test_every_used_filter_has_a_page():
    missing = [name for name in used_filters() if name not in DOCS]
    assert not missing, f"filters used by roles/playbooks/scenarios without plugins/filter/<name>.yml: {missing}"


def test_every_exported_filter_is_used():
    unused = sorted(set(FILTERS) - set(used_filters()))
    assert not unused, ("exported filters that no role, playbook, scenario or doc applies: drop them from "
                        f"FilterModule.filters() (plugins/filter/pd.py) and their pages: {unused}")


def test_every_exported_filter_has_a_page_and_every_page_an_exported_filter():
    assert sorted(FILTERS) == DOCS


@pytest.mark.parametrize("name", DOCS)
def test_page_documents_a_real_filter_with_real_types(name):
    with open(os.path.join(PLUGIN_DIR, f"{name}.yml"), encoding="utf-8") as handle:
        page = yaml.safe_load(handle)
    assert set(page) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, name
    doc = page["DOCUMENTATION"]
    assert doc["name"] == name and name in FILTERS, f"{name}.yml documents no filter of plugins/filter/pd.py"
    assert doc["short_description"] and doc["description"] and doc["author"]
    params = [p for p in inspect.signature(FILTERS[name]).parameters.values()
              if not p.name.startswith("_") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    expected = ["_input"] + [p.name for p in params[1:]]
    assert sorted(doc["options"]) == sorted(expected), f"{name}: options are not the function's parameters"
    if params[1:]:
        assert [s.strip() for s in doc["positional"].split(",")] == [p.name for p in params[1:]], name
    for key, param in zip(expected, params):
        option = doc["options"][key]
        assert option["type"] in TYPES, f"{name}: {key} has type {option['type']!r}"
        assert option.get("description"), f"{name}: {key} has no description"
        assert bool(option.get("required")) == (param.default is param.empty), f"{name}: {key} required?"
        if param.default is not param.empty and param.default is not None:
            assert option.get("default") == param.default, f"{name}: {key} default differs from the function's"
    returned = page["RETURN"]["_value"]
    assert returned["type"] in TYPES and returned.get("description"), f"{name}: RETURN _value"
    examples = yaml.safe_load(page["EXAMPLES"])
    assert isinstance(examples, list) and examples, name
    assert re.search(r"\|\s*pd\.deploy\.%s\b|['\"]pd\.deploy\.%s['\"]" % (name, name), page["EXAMPLES"]), f"{name}: no example uses it"


def test_ansible_doc_renders_every_page():
    doc = os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    result = subprocess.run([doc, "-t", "filter", "--json", *(f"pd.deploy.{name}" for name in DOCS)], cwd=REPO, capture_output=True, text=True,
                            check=False, timeout=180)
    assert result.returncode == 0 and "ERROR" not in result.stderr, result.stderr
    pages = json.loads(result.stdout)
    assert sorted(pages) == [f"pd.deploy.{name}" for name in DOCS]
    assert all(page["doc"]["name"] == name.split(".")[-1] and page["return"] for name, page in pages.items())
