"""Roles, playbooks and scenarios name pd-deploy's filters, modules and roles by the collection's name
(issue 22 #1): ``| pd.deploy.pd_to_bytes``, ``pd.deploy.pd_host_probe:``, ``name: pd.deploy.pd_plan``.

An installed collection has no ansible.cfg ``filter_plugins``, and ansible-core resolves a filter's short
name only through it (the ``collections:`` keyword does not apply to filters): a short name that works
in the checkout would be "No filter named" for every operator of the installed collection.
"""

import glob
import os
import re

from ansible_collections.pd.deploy.plugins.filter import pd, pd_paths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILTERS = sorted({**pd.FilterModule().filters(), **pd_paths.FilterModule().filters()})
MODULES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "plugins", "modules", "pd_*.py")))
ROLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "roles", "pd_*")))
GLOBS = ("roles/**/*.yml", "roles/**/*.j2", "playbooks/**/*.yml", "molecule/**/*.yml", "*.yml",
         "plugins/filter/*.yml")

_F = "|".join(sorted(FILTERS, key=len, reverse=True))
SHORT = [
    ("filter", re.compile(r"\|\s*(%s)\b(?!\.)" % _F)),
    ("filter", re.compile(r"""\b(?:map|select|reject|selectattr|rejectattr)\(\s*['"](%s)['"]""" % _F)),
    ("module", re.compile(r"^\s*(?:-\s+)?(%s):" % "|".join(MODULES), re.M)),
    ("role", re.compile(r"^\s*(?:-\s+)?(?:name|role):\s+(%s)\s*$" % "|".join(ROLES), re.M)),
    ("role", re.compile(r"^\s*roles:\s*\n\s*-\s+(%s)\s*$" % "|".join(ROLES), re.M)),
]


def short_names(text):
    """(kind, name) of every pd-deploy filter, module or role written without pd.deploy."""
    return [(kind, m.group(1)) for kind, pattern in SHORT for m in pattern.finditer(text)]


def test_nothing_is_named_by_its_short_name():
    found = []
    for pattern in GLOBS:
        for path in sorted(glob.glob(os.path.join(REPO, pattern), recursive=True)):
            with open(path, encoding="utf-8") as handle:
                for kind, name in short_names(handle.read()):
                    found.append(f"{os.path.relpath(path, REPO)}: {kind} {name} (write pd.deploy.{name})")
    assert not found, "short names only the checkout's ansible.cfg could resolve:\n" + "\n".join(found)


def test_the_scan_catches_each_kind_and_passes_the_qualified_forms():
    assert short_names("x: '{{ a | pd_to_bytes }}'") == [("filter", "pd_to_bytes")]
    assert short_names("x: \"{{ a | map('pd_host_specs') }}\"") == [("filter", "pd_host_specs")]
    assert short_names("- name: Probe\n  pd_host_probe:\n    a: 1\n") == [("module", "pd_host_probe")]
    assert short_names("  ansible.builtin.include_role:\n    name: pd_container\n") == [("role", "pd_container")]
    assert short_names("x: '{{ a | pd.deploy.pd_to_bytes }}'\n  pd.deploy.pd_host_probe:\n"
                       "    name: pd.deploy.pd_container\n") == []
    assert len(FILTERS) > 40 and "pd_abspath" in FILTERS and MODULES and "pd_plan" in ROLES
