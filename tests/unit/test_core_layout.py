"""The collection's code stays readable: no Python file under plugins/ (the core in plugin_utils/, the filter,
module, action and vars plugins, module_utils) over 600 lines, no function over 80 lines unless
its def line (or the comment line right above it) says why: ``# long: <reason>``.

KNOWN lists what is still over, with its size when it was listed; it may only shrink: an entry that
grew fails, and so does one that is no longer over (delete it then).
"""

import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: (path, function or None for the module) -> lines when listed. Shrink only.
#: Empty since rules.py, fleet.py and the long ops functions were split; keep it that way.
KNOWN = {}


def _modules():
    for path in sorted(glob.glob(os.path.join(REPO, "plugins", "**", "*.py"), recursive=True)):
        yield os.path.relpath(path, REPO).replace(os.sep, "/"), path


def _functions(tree, lines, prefix=""):
    """(qualified name, lines) of every module-level function and method, nested ones counted in
    their parent; a `# long:` reason on the def line or the line above exempts it."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _functions(node, lines, prefix + node.name + ".")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            context = lines[first - 2:node.lineno] if first >= 2 else lines[:node.lineno]
            if any("# long:" in line and line.split("# long:", 1)[1].strip() for line in context):
                continue
            yield prefix + node.name, node.end_lineno - first + 1


def measured():
    """{(path, function or None): lines} of everything over its limit, KNOWN or not."""
    over = {}
    for rel, path in _modules():
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        lines = text.splitlines()
        if len(lines) > MAX_MODULE_LINES:
            over[(rel, None)] = len(lines)
        for name, length in _functions(ast.parse(text), lines):
            if length > MAX_FUNCTION_LINES:
                over[(rel, name)] = length
    return over


def test_nothing_new_is_over_its_limit():
    new = {key: n for key, n in measured().items() if key not in KNOWN}
    assert new == {}, (f"over {MAX_MODULE_LINES} lines per module / {MAX_FUNCTION_LINES} per function: split it "
                       "by what it decides, or give a function a `# long: <reason>` comment on its def line")


def test_known_entries_only_shrink():
    now = measured()
    grew = {key: (KNOWN[key], n) for key, n in now.items() if key in KNOWN and n > KNOWN[key]}
    assert grew == {}, "a KNOWN entry grew (listed, now): shrink it instead"


def test_known_entries_are_still_over():
    now = measured()
    stale = [key for key in KNOWN if key not in now]
    assert stale == [], "within their limit now: delete them from KNOWN"


def test_long_reason_is_honoured_and_needs_text():
    source = ("def a():\n" + "    x = 1\n" * 90
              + "def b():  # long: one table, read top to bottom\n" + "    x = 1\n" * 90
              + "# long:\ndef c():\n" + "    x = 1\n" * 90)
    lines = source.splitlines()
    found = dict(_functions(ast.parse(source), lines))
    assert set(found) == {"a", "c"} and found["a"] == 91


def test_the_scan_reads_the_core_and_every_plugin_type():
    # the folder moved once (pd_deploy/ -> plugins/plugin_utils/, issue 22): a wrong glob would pass empty
    paths = [rel for rel, _ in _modules()]
    assert "plugins/plugin_utils/plan/fleet.py" in paths and len(paths) > 30, paths
    for plugin in ("filter/pd.py", "modules/pd_host_probe.py", "action/pd_plan_check.py", "vars/pd_group_vars.py",
                   "module_utils/pd_http.py"):
        assert f"plugins/{plugin}" in paths, plugin


# how code was found before the collection layout (issue 22): a path pushed onto sys.path, or a file
# executed by its path; both bypass the import system the collection loader and ansible-test rely on
LOADERS = ("sys.path.insert", "sys.path.append", "spec_from_file_location", "SourceFileLoader",
           "module_from_spec")


def _python_files():
    for top in ("plugins", "tests", "tools", "bench"):
        for path in glob.glob(os.path.join(REPO, top, "**", "*.py"), recursive=True):
            if os.path.abspath(path) != os.path.abspath(__file__):
                yield os.path.relpath(path, REPO).replace(os.sep, "/"), path


def test_code_imports_normally_with_no_file_loader_or_sys_path_insertion():
    found = []
    for rel, path in _python_files():
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        found += [f"{rel}: {name}" for name in LOADERS if name in text]
    assert found == [], ("import it under its package (tests.fixtures..., ansible_collections.pd.deploy...); "
                         f"a fixture directory must have an importable name: {found}")


def test_the_loader_scan_reads_the_tests():
    paths = {rel for rel, _ in _python_files()}
    assert {"tests/unit/test_vllm_cpu_plugin.py", "tests/fixtures/standin_procs.py", "plugins/filter/pd.py",
            "tools/variable_reference.py"} <= paths


def test_every_plugin_file_carries_the_collection_license_header():
    """galaxy.yml says GPL-3.0-or-later; validate-modules (make check-collection) fails a module without
    the GPLv3 header, this catches any plugin file (filter, action, vars, utils too) before it ships."""
    missing = []
    for rel, path in _modules():
        with open(path, encoding="utf-8") as handle:
            head = handle.read().splitlines()[:5]
        if "# SPDX-License-Identifier: GPL-3.0-or-later" not in head:
            missing.append(rel)
    assert missing == [], ("start each with the three header lines of plugins/filter/pd.py "
                           f"(copyright, GPL v3.0+ pointer, SPDX identifier): {missing}")


def test_no_plugin_line_is_longer_than_the_sanity_pep8_limit():
    """ansible-test sanity's pep8 (make check-collection, after the unit tests in CI) refuses a line of over
    160 characters in the built collection; a docstring line of 190 slipped through the unit tests once and
    failed the whole CI run at that step. Caught here first, with the place to fix."""
    long_lines = []
    for rel, path in _modules():
        with open(path, encoding="utf-8") as handle:
            long_lines += [f"{rel}:{n}: {len(line)} characters" for n, line in enumerate(handle.read().splitlines(), 1)
                           if len(line) > 160]
    assert long_lines == [], f"wrap these lines to at most 160 characters: {long_lines}"


def test_the_license_is_the_gpl_v3_text_galaxy_names():
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as handle:
        text = handle.read()
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as handle:
        galaxy = handle.read()
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text
    assert "\n  - GPL-3.0-or-later\n" in galaxy and "license_file" not in galaxy
