#!/usr/bin/env python3
"""Assemble the Ansible collection pd.deploy from this repository and build its tarball.

The repository keeps its own layout (roles/, playbooks/, filter_plugins/, library/, ...); this script
copies it into build/collection/ansible_collections/<namespace>/<name>/ in the layout a collection
needs, then runs ``ansible-galaxy collection build``. Changes made on the way, each because a
collection cannot work without it:

- playbooks/<a-b>.yml -> playbooks/<a_b>.yml: a collection playbook is called by an FQCN
  (``pd.deploy.deploy_pd``), whose parts must be Python identifiers.
- roles, modules, the action plugin and filters are referenced by FQCN in the copied roles and
  playbooks: ansible-core resolves short names of filters only through ansible.cfg's
  filter_plugins (the `collections:` keyword does not apply to filters), and the repository's
  ansible.cfg is not there when the collection runs from another directory.
- library/*.py -> plugins/modules/, importing module_utils from the collection's own path.
- filter_plugins/pd.py -> plugins/filter/pd.py, finding pd_deploy/ at the collection root (two
  directories further up than in the repository); pd_deploy/, schemas/ and roles/ sit at the
  collection root exactly as in the repository, so datafiles.py and inventory.role_defaults() read
  them by the same relative paths.
- The build directory defaults to <working directory>/build instead of <playbook dir>/../build: the
  installed collection is read-only data, and the inventory may live outside any checkout.
- plugins/filter/<filter>.yml: the ansible-doc page of every filter: the checked-in filter_plugins/<filter>.yml
  of a public one (examples rewritten to the FQCN), else one made from its docstring.

Usage: python tools/build-collection.py [--out build/collection]
Prints the path of the tarball.
"""

import argparse
import glob
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GALAXY = os.path.join(REPO, "collection", "galaxy.yml")

# the line of filter_plugins/pd.py that locates pd_deploy/, and its collection form
_FILTER_ROOT = "_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"
_FILTER_ROOT_COLLECTION = (
    "# collection: plugins/filter/pd.py -> the collection root holds pd_deploy/ (tools/build-collection.py)\n"
    "_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))")
_MODULE_UTILS = "from ansible.module_utils."
# where the repository's playbooks and roles write by default, and the collection's default
_BUILD_DIRS = (
    ("{{ playbook_dir }}/../build", "{{ 'build' | pd.deploy.pd_abspath }}"),
    ("playbook_dir ~ '/../build", "('build' | pd.deploy.pd_abspath) ~ '"),
)


def galaxy():
    with open(GALAXY, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _filters_of(path):
    spec = importlib.util.spec_from_file_location("_pd_filters_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def filter_functions():
    """{name: function} of filter_plugins/pd.py and the collection-only collection/plugins/filter/*.py."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    out = _filters_of(os.path.join(REPO, "filter_plugins", "pd.py"))
    for path in sorted(glob.glob(os.path.join(REPO, "collection", "plugins", "filter", "*.py"))):
        out.update(_filters_of(path))
    return out


def playbook_name(filename):
    """deploy-pd.yml -> deploy_pd.yml (collection playbook names are Python identifiers)."""
    stem, ext = os.path.splitext(filename)
    name = re.sub(r"[^0-9A-Za-z_]", "_", stem)
    if not name.isidentifier():
        raise SystemExit(f"playbooks/{filename}: no valid collection playbook name ({name}) — rename the playbook")
    return name + ext


def fqcn_rewriter(fqcn, filters, roles, actions, playbooks):
    """A function rewriting short names in one YAML/Jinja text to FQCNs of the collection."""
    filter_alt = "|".join(sorted(map(re.escape, filters), key=len, reverse=True))
    role_alt = "|".join(sorted(map(re.escape, roles), key=len, reverse=True))
    action_alt = "|".join(sorted(map(re.escape, actions), key=len, reverse=True))
    patterns = [
        # `value | pd_x`, `value | pd_x(...)`
        (re.compile(r"(\|\s*)(" + filter_alt + r")\b(?!\.)"), lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}"),
        # map('pd_x'), select('pd_x', ...)
        (re.compile(r"""((?:map|select|reject|selectattr|rejectattr)\(\s*['"])(""" + filter_alt + r")(['\"])"),
         lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}{m.group(3)}"),
        # include_role / import_role: name: pd_x
        (re.compile(r"^(\s*(?:-\s+)?name:\s+)(" + role_alt + r")\s*$", re.M), lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}"),
        # `- role: pd_x` / `roles: [- pd_x]`
        (re.compile(r"^(\s*-\s+(?:role:\s+)?)(" + role_alt + r")\s*$", re.M), lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}"),
        # task keyword of a module or action plugin: `pd_x:`
        (re.compile(r"^(\s*(?:-\s+)?)(" + action_alt + r"):", re.M), lambda m: f"{m.group(1)}{fqcn}.{m.group(2)}:"),
    ]
    imports = [(re.compile(r"^(\s*(?:-\s+)?(?:ansible\.builtin\.)?import_playbook:\s+)(\S+\.yml)\s*$", re.M),
                lambda m: m.group(1) + playbooks.get(m.group(2), m.group(2)))]

    def rewrite(text):
        for pattern, repl in patterns + imports:
            text = pattern.sub(repl, text)
        for old, new in _BUILD_DIRS:
            text = text.replace(old, new)
        return text
    return rewrite


def _first_line_and_rest(doc):
    lines = inspect.cleandoc(doc or "").splitlines()
    if not lines or not lines[0].strip():
        return None, []
    paragraphs, current = [], []
    for line in lines[1:]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return lines[0].strip(), paragraphs


def filter_doc(name, function, fqcn, version):
    """The plugins/filter/<name>.yml document of one filter, from its docstring and signature."""
    short, rest = _first_line_and_rest(function.__doc__)
    if not short:
        raise SystemExit(f"filter {name} ({function.__module__}.{function.__name__}): no docstring — "
                         "write one, it is the filter's ansible-doc text")
    params = list(inspect.signature(function).parameters.values())
    options, positional = {}, []
    for index, param in enumerate(params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        key = "_input" if index == 0 else param.name
        option = {"description": ("The value left of the filter's pipe." if index == 0 else
                                  f"Argument {param.name} of {function.__module__}.{function.__name__}."),
                  "type": "raw"}
        if param.default is param.empty:
            option["required"] = True
        else:
            option["default"] = param.default if isinstance(param.default, (str, int, float, bool, type(None))) \
                else repr(param.default)
        options[key] = option
        if index > 0 and param.kind != param.KEYWORD_ONLY:
            positional.append(param.name)
    documentation = {
        "name": name,
        "version_added": version,
        "short_description": short.rstrip("."),
        "description": rest or [short],
        "author": ["pd-deploy maintainers"],
        "options": options,
        "notes": [f"Implemented by {function.__module__}.{function.__name__} (pure Python, unit tested)."],
    }
    if positional:
        documentation["positional"] = ", ".join(positional)
    args = ", ".join(positional)
    example = f"{{{{ value | {fqcn}.{name}({args}) }}}}" if args else f"{{{{ value | {fqcn}.{name} }}}}"
    return {
        "DOCUMENTATION": documentation,
        "EXAMPLES": f"- name: Use {name}\n  ansible.builtin.debug:\n    msg: \"{example}\"\n",
        "RETURN": {"_value": {"description": "See the description.", "type": "raw"}},
    }


def filter_page(name, function, fqcn, version, rewrite):
    """The plugins/filter/<name>.yml text: the checked-in filter_plugins/<name>.yml of a public filter (its
    examples rewritten to the FQCN), else the page made from the docstring (filters no role uses)."""
    checked_in = os.path.join(REPO, "filter_plugins", f"{name}.yml")
    if os.path.isfile(checked_in):
        return rewrite(_read(checked_in))
    return "---\n" + yaml.safe_dump(filter_doc(name, function, fqcn, version), sort_keys=False, width=120,
                                     allow_unicode=True)


def _copytree(src, dst, rewrite=None):
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in files:
            if name.endswith(".pyc"):
                continue
            source, target = os.path.join(root, name), os.path.join(dst, rel, name)
            if rewrite and name.endswith((".yml", ".yaml", ".j2")):
                with open(source, encoding="utf-8") as handle:
                    text = rewrite(handle.read())
                with open(target, "w", encoding="utf-8") as handle:
                    handle.write(text)
            else:
                shutil.copy2(source, target)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def assemble(out):
    """Lay the collection out under <out>/ansible_collections/<ns>/<name>; return that path."""
    meta = galaxy()
    fqcn = f"{meta['namespace']}.{meta['name']}"
    root = os.path.join(out, "ansible_collections", meta["namespace"], meta["name"])
    if os.path.isdir(os.path.join(out, "ansible_collections")):
        shutil.rmtree(os.path.join(out, "ansible_collections"))
    os.makedirs(root)

    filters = filter_functions()
    roles = sorted(d for d in os.listdir(os.path.join(REPO, "roles")) if not d.startswith("."))
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "library")) if f.endswith(".py"))
    actions = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "action_plugins")) if f.endswith(".py"))
    playbooks = {f: playbook_name(f) for f in sorted(os.listdir(os.path.join(REPO, "playbooks"))) if f.endswith(".yml")}
    rewrite = fqcn_rewriter(fqcn, filters, roles, modules + actions, playbooks)

    shutil.copy2(GALAXY, os.path.join(root, "galaxy.yml"))
    for name in ("CHANGELOG.md", "LICENSE"):
        shutil.copy2(os.path.join(REPO, "collection", name), os.path.join(root, name))
    _copytree(os.path.join(REPO, "collection", "meta"), os.path.join(root, "meta"))
    _copytree(os.path.join(REPO, "collection", "plugins"), os.path.join(root, "plugins"))
    shutil.copy2(os.path.join(REPO, "README.md"), os.path.join(root, "README.md"))
    _copytree(os.path.join(REPO, "docs"), os.path.join(root, "docs"))
    for folder in ("pd_deploy", "schemas"):
        _copytree(os.path.join(REPO, folder), os.path.join(root, folder))
    _copytree(os.path.join(REPO, "roles"), os.path.join(root, "roles"), rewrite)
    for source, target in playbooks.items():
        _write(os.path.join(root, "playbooks", target), rewrite(_read(os.path.join(REPO, "playbooks", source))))
    for folder in sorted(os.listdir(os.path.join(REPO, "playbooks"))):
        if os.path.isdir(os.path.join(REPO, "playbooks", folder)):
            _copytree(os.path.join(REPO, "playbooks", folder), os.path.join(root, "playbooks", folder))

    plugins = os.path.join(root, "plugins")
    filter_src = _read(os.path.join(REPO, "filter_plugins", "pd.py"))
    if _FILTER_ROOT not in filter_src:
        raise SystemExit(f"filter_plugins/pd.py: the line `{_FILTER_ROOT}` moved; update _FILTER_ROOT in {__file__}")
    _write(os.path.join(plugins, "filter", "pd.py"), filter_src.replace(_FILTER_ROOT, _FILTER_ROOT_COLLECTION))
    for name, function in sorted(filters.items()):
        _write(os.path.join(plugins, "filter", f"{name}.yml"), filter_page(name, function, fqcn, meta["version"], rewrite))
    utils_import = f"from ansible_collections.{meta['namespace']}.{meta['name']}.plugins.module_utils."
    for name in modules:
        text = _read(os.path.join(REPO, "library", f"{name}.py"))
        _write(os.path.join(plugins, "modules", f"{name}.py"),
               re.sub(r"^from ansible\.module_utils\.(?!basic\b)", utils_import, text, flags=re.M))
    for folder, target in (("module_utils", "module_utils"), ("action_plugins", "action"), ("vars_plugins", "vars")):
        _copytree(os.path.join(REPO, folder), os.path.join(plugins, target))
    return root


def build(out):
    root = assemble(out)
    # the ansible-galaxy of this Python's venv first (requirements.txt pins it), else the one on PATH
    ansible_galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    if not os.path.isfile(ansible_galaxy):
        ansible_galaxy = shutil.which("ansible-galaxy") or "ansible-galaxy"
    result = subprocess.run([ansible_galaxy, "collection", "build", "--force", "--output-path", out, root],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"ansible-galaxy collection build failed:\n{result.stdout}{result.stderr}")
    meta = galaxy()
    tarball = os.path.join(out, f"{meta['namespace']}-{meta['name']}-{meta['version']}.tar.gz")
    if not os.path.isfile(tarball):
        raise SystemExit(f"ansible-galaxy collection build wrote no {tarball}:\n{result.stdout}")
    return tarball


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "build", "collection"))
    args = parser.parse_args()
    print(build(os.path.abspath(args.out)))


if __name__ == "__main__":
    main()
