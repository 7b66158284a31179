"""docs/design.md and docs/development.md name only code that exists (issue 22: design.md named a
function, ``model.launch_specs()``, that never did).

Checked: every ``module.attribute`` of a core module (``fleet.plan_fleet``,
``plugin_utils.plan.model.normalize``: the core is the collection's plugins/plugin_utils/), every ``name()``
(a def or class of that name in the repository's Python), and every path into this repository
(``plugins/plugin_utils/plan/fleet.py``, ``roles/pd_plan/``).
"""

import importlib
import os
import pkgutil
import re

import pytest

from ansible_collections.pd.deploy.plugins import plugin_utils

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ("docs/design.md", "docs/development.md")
TOP = ("plugins", "roles", "playbooks", "tools", "tests", "bench", "molecule", "docs", "inventories", "collections")
PACKAGE = "ansible_collections.pd.deploy.plugins.plugin_utils"
# every module by its dotted path under plugin_utils ("plan.fleet") and, where the last part is unique, by
# that part alone ("fleet"); a name written with the package ("plugin_utils.plan.fleet.x") must be the full path
_ALL = [m.name[len(PACKAGE) + 1:] for m in pkgutil.walk_packages(plugin_utils.__path__, PACKAGE + ".")]
_LAST = [name.rsplit(".", 1)[-1] for name in _ALL]
MODULES = {name: PACKAGE + "." + name for name in _ALL}
SHORT = {last: PACKAGE + "." + name for name, last in zip(_ALL, _LAST) if _LAST.count(last) == 1 and last not in MODULES}
# a repo path: starts with a top folder, not inside an upstream path (vllm_ascend/..., vllm-project/x:docs/...)
PATH = re.compile(r"(?<![\w./:-])((?:%s)/[\w./-]*[\w/])" % "|".join(TOP))
ATTR = re.compile(r"(?<![\w.])(plugin_utils\.)?((?:[a-z_]+\.)*[a-z_]+)\.([A-Za-z_]\w*)")
CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(\)")


def _read(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        return handle.read()


def _python_names():
    names = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "collections", "__pycache__")]
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as handle:
                    names.update(re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", handle.read(), re.M))
    return names


def _line(text, index):
    return text.count("\n", 0, index) + 1


@pytest.mark.parametrize("page", PAGES)
def test_named_module_attributes_exist(page):
    text = _read(page)
    missing = []
    for match in ATTR.finditer(text):
        full, module, attr = match.groups()
        if attr in ("py", "yml", "md", "json"):
            continue
        where = f"{page}:{_line(text, match.start())}: {match.group(0)}"
        if module == "plugin_utils":  # plugin_utils.<module or package>
            if attr not in MODULES and not hasattr(plugin_utils, attr):
                missing.append(where + " (no such module under plugins/plugin_utils)")
        elif full and module not in MODULES:  # written with the package: the full path, not a short name
            missing.append(where + " (no such module under plugins/plugin_utils)")
        elif (MODULES.get(module) or SHORT.get(module)) and not hasattr(
                importlib.import_module(MODULES.get(module) or SHORT[module]), attr):
            missing.append(where)
    assert not missing, "named in the docs, absent from the code:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES)
def test_named_functions_exist(page):
    text, names = _read(page), _python_names()
    missing = [f"{page}:{_line(text, m.start())}: {m.group(1)}()" for m in CALL.finditer(text)
               if m.group(1) not in names]
    assert not missing, "functions named in the docs that no Python file defines:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES)
def test_named_paths_exist(page):
    text = _read(page)
    missing = [f"{page}:{_line(text, m.start())}: {m.group(1)}" for m in PATH.finditer(text)
               if not os.path.exists(os.path.join(REPO, m.group(1).rstrip(".")))]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_checks_catch_what_they_look_for():
    assert ATTR.search("`model.launch_specs()`").groups() == (None, "model", "launch_specs")
    assert not hasattr(importlib.import_module(SHORT["model"]), "launch_specs")
    assert ATTR.search("plugin_utils.plan.fleet.plan_fleet").groups() == ("plugin_utils.", "plan.fleet", "plan_fleet")
    assert ATTR.search("plugin_utils.fleet.plan_fleet").groups() == ("plugin_utils.", "fleet", "plan_fleet")
    assert "fleet" not in MODULES and SHORT["fleet"] == PACKAGE + ".plan.fleet"
    assert CALL.search("see launch_specs() here").group(1) == "launch_specs"
    assert PATH.search("in plugins/plugin_utils/fleet.py, and").group(1) == "plugins/plugin_utils/fleet.py"
    assert not PATH.search("vllm_ascend/models/deepseek_v4/model.py")
    assert not PATH.search("vllm-project/vllm main:docs/source/x.md")
