#!/usr/bin/env python3
"""Generate docs/reference/variables.md: every variable an operator can set, from the files that define it.

Sources (the page is never edited by hand):

- plugins/plugin_utils/data/variables.yml: playbook switches and variables shared by several roles;
- plugins/plugin_utils/schemas/host.schema.json and the ``host`` defaults of plugins/plugin_utils/data/defaults.yml: host variables;
- plugins/plugin_utils/schemas/cluster.schema.json and plugins/plugin_utils/data/defaults.yml: every key of ``pd_cluster``, with its
  default (``prefill.*`` / ``decode.*``: ``role_common`` merged with the role's own defaults);
- roles/*/meta/argument_specs.yml: each role's public variables, per entry point.

It also writes plugins/plugin_utils/data/role_variables.yml: the names of every role's public variables
(defaults/main.yml and meta/argument_specs.yml), which validation accepts on a host. The core reads that
file, never roles/ at run time.

Usage: python tools/variable_reference.py [--check] [--out docs/reference/variables.md]
``--check`` writes nothing and exits 1 when the page (or role_variables.yml) differs from what the sources give (CI: `make
unit` runs it through tests/unit/test_variable_reference.py); without it the page is (re)written.
"""

import argparse
import copy
import json
import os
import re
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join("docs", "reference", "variables.md")
ROLE_VARIABLES = os.path.join("plugins", "plugin_utils", "data", "role_variables.yml")
ROLES = ("prefill", "decode")


def _load_yaml(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _load_json(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as handle:
        return json.load(handle)


def _merge(base, override):
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cell(value):
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")


def shown(value):
    """A default as the inventory would write it."""
    if value is None:
        return "`null`"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, sort_keys=True) + "`" if value else ("`{}`" if isinstance(value, dict) else "`[]`")
    return f"`{value}`"


def schema_type(node, defs):
    """Type and constraints of a JSON Schema node as short text."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return name if name == "size" else schema_type(defs[name], defs)
    if "anyOf" in node:
        return " or ".join(schema_type(n, defs) for n in node["anyOf"])
    if "enum" in node:
        return "one of " + ", ".join(shown(v) for v in node["enum"])
    kinds = node.get("type", "any")
    names = {"object": "mapping", "array": "list", "boolean": "bool"}
    kind = " or ".join(names.get(k, k) for k in (kinds if isinstance(kinds, list) else [kinds]))
    bounds = []
    if "minimum" in node:
        bounds.append(f">= {node['minimum']}")
    if "exclusiveMinimum" in node:
        bounds.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        bounds.append(f"<= {node['maximum']}")
    if node.get("pattern") == "^/":
        bounds.append("absolute path")
    elif "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    if node.get("minLength"):
        bounds.append("not empty")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _object_of(node, defs):
    """The object branch of a node (itself, or the object alternative of an anyOf), else None."""
    if node.get("type") == "object" and "properties" in node:
        return node
    for alt in node.get("anyOf", []):
        if alt.get("type") == "object" and "properties" in alt:
            return alt
    return None


def schema_rows(node, defs, defaults, prefix, required=()):
    """(path, type, default, description) of every leaf of an object schema, depth first in file order."""
    rows = []
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        default = defaults.get(key) if isinstance(defaults, dict) else None
        inner = _object_of(child, defs)
        note = child.get("description", "")
        if key in required:
            note = ("required. " + note).strip()
        if inner is not None and inner.get("additionalProperties") is False:
            own = shown(default) if isinstance(defaults, dict) and key in defaults and not isinstance(default, dict) else ""
            rows.append((path, schema_type(child, defs) if inner is not child else "mapping", own, note))
            rows.extend(schema_rows(inner, defs, default or {}, path, inner.get("required", ())))
        else:
            has_default = isinstance(defaults, dict) and key in defaults
            rows.append((path, schema_type(child, defs), shown(default) if has_default else "", note))
    return rows


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def switches_section():
    data = _load_yaml("plugins", "plugin_utils", "data", "variables.yml")["variables"]
    rows = [(f"`{name}`", shown(spec["default"]) if "default" in spec else "", spec.get("description", ""))
            for name, spec in data.items()]
    return ("## Playbook switches and shared variables\n\n"
            "From `plugins/plugin_utils/data/variables.yml`: given with `-e` to one run, or set in the inventory where the\n"
            "description says so. Any other `pd_*` variable on a cluster host is refused by validation.\n\n"
            + table(("variable", "default", "what it does"), rows))


def host_section():
    schema = _load_json("plugins", "plugin_utils", "schemas", "host.schema.json")
    host_defaults = _load_yaml("plugins", "plugin_utils", "data", "defaults.yml")["host"]
    defaults = {}
    for key, value in host_defaults.items():
        name = f"pd_{key}" if f"pd_{key}" in schema["properties"] else f"pd_host_{key}"
        defaults[name] = value
    rows = [(f"`{path}`", kind, default or ("(none: required)" if "required" in note else ""), note)
            for path, kind, default, note in schema_rows(schema, schema.get("$defs", {}), defaults, "")]
    return ("## Host variables\n\n"
            "From `plugins/plugin_utils/schemas/host.schema.json`, defaults from `plugins/plugin_utils/data/defaults.yml` (`host`). Set in\n"
            "`host_vars/<host>.yml` or `hosts.yml`; `ansible_host` is the address when `pd_host_address` is unset.\n\n"
            + table(("variable", "type", "default", "notes"), rows))


def cluster_section():
    schema = _load_json("plugins", "plugin_utils", "schemas", "cluster.schema.json")
    defs = schema.get("$defs", {})
    data = _load_yaml("plugins", "plugin_utils", "data", "defaults.yml")
    defaults = dict(data["cluster"])
    for role in ROLES:
        defaults[role] = _merge(data["role_common"], data[role])
    rows = [(f"`pd_cluster.{path}`", kind, default, note)
            for path, kind, default, note in schema_rows(schema, defs, defaults, "", schema.get("required", ()))]
    return ("## Cluster settings: `pd_cluster`\n\n"
            "One mapping per cluster in `group_vars/<cluster>.yml`, shape from `plugins/plugin_utils/schemas/cluster.schema.json`,\n"
            "defaults from `plugins/plugin_utils/data/defaults.yml` (deep-merged: state only what differs; `prefill.*` and\n"
            "`decode.*` are `role_common` merged with the role's own values). A null recipe item takes the model\n"
            "family's value (`plugins/plugin_utils/data/models.yml`). Sizes: an integer byte count or a number and a binary\n"
            "unit (`200GiB`); `200G` / `200GB` are refused.\n\n"
            + table(("key", "type", "default", "notes"), rows))


def _description(spec):
    """An argument spec's description as Markdown (Ansible's C(x) / O(x) / V(x) markup as code)."""
    text = spec.get("description", "")
    text = " ".join(text) if isinstance(text, list) else text
    return re.sub(r"\b[COVIR]\(([^()]*)\)", r"`\1`", text)


def role_sections():
    out = []
    for role in sorted(os.listdir(os.path.join(REPO, "roles"))):
        path = os.path.join("roles", role, "meta", "argument_specs.yml")
        if not os.path.isfile(os.path.join(REPO, path)):
            continue
        specs = _load_yaml(path)["argument_specs"]
        for entry, spec in specs.items():
            title = f"### {role}" + ("" if entry == "main" else f" (entry point `{entry}`)")
            rows = []
            for name, option in (spec.get("options") or {}).items():
                kind = option.get("type", "str")
                if option.get("elements"):
                    kind += f" of {option['elements']}"
                if option.get("choices"):
                    kind += " (one of " + ", ".join(shown(c) for c in option["choices"]) + ")"
                default = "(required)" if option.get("required") else (
                    shown(option["default"]) if "default" in option else "")
                rows.append((f"`{name}`", kind, default, _description(option)))
            lead = cell(spec.get("short_description", ""))
            body = table(("variable", "type", "default", "description"), rows) if rows else "No variables."
            out.append(f"{title}\n\n{lead}. `{path}`.\n\n{body}")
    return ("## Role variables\n\n"
            "From each role's `meta/argument_specs.yml` (a test keeps it equal to `defaults/main.yml`). Set them\n"
            "in `group_vars` or with `-e`.\n\n" + "\n\n".join(out))


def role_variables(roles_dir=os.path.join(REPO, "roles")):
    """{role: sorted names} of each role's defaults/main.yml keys and meta/argument_specs.yml options."""
    out = {}
    for role in sorted(os.listdir(roles_dir)):
        names = set()
        defaults = os.path.join(roles_dir, role, "defaults", "main.yml")
        specs = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if os.path.isfile(defaults):
            with open(defaults, encoding="utf-8") as handle:
                names.update((yaml.safe_load(handle) or {}).keys())
        if os.path.isfile(specs):
            with open(specs, encoding="utf-8") as handle:
                for entry in ((yaml.safe_load(handle) or {}).get("argument_specs") or {}).values():
                    names.update((entry.get("options") or {}).keys())
        if names:
            out[role] = sorted(names)
    return out


def role_variables_text():
    """plugins/plugin_utils/data/role_variables.yml as `make docs` writes it."""
    return ("---\n# Generated by tools/variable_reference.py (make docs) from roles/*/defaults/main.yml and\n"
            "# roles/*/meta/argument_specs.yml; do not edit. Validation accepts these pd_* names on a host\n"
            "# (plugin_utils.validate.inventory.role_defaults); tests/unit/test_variable_reference.py fails when stale.\n"
            + "roles:\n" + "".join(f"  {role}:\n" + "".join(f"    - {name}\n" for name in names)
                                   for role, names in role_variables().items()))


def render():
    parts = [
        "# Variable reference",
        "<!-- Generated by tools/variable_reference.py (make docs); do not edit. "
        "tests/unit/test_variable_reference.py fails when it is stale. -->",
        "Every variable pd-deploy reads, where it goes and its default. How to use them: "
        "[the operator guide](../guide/README.md).",
        switches_section(),
        host_section(),
        cluster_section(),
        role_sections(),
    ]
    return "\n\n".join(parts) + "\n"


def _sync(path, text, check):
    """0 when ``path`` holds ``text``; else 1 with --check, or write it and return 0."""
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except FileNotFoundError:
        current = None
    if current == text:
        return 0
    if check:
        print(f"{os.path.relpath(path, REPO)} is stale: run `make docs` (tools/variable_reference.py) "
              "and commit the result", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {os.path.relpath(path, REPO)}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale; write nothing")
    parser.add_argument("--out", default=os.path.join(REPO, OUT))
    args = parser.parse_args(argv)
    page = _sync(args.out, render(), args.check)
    data = _sync(os.path.join(REPO, ROLE_VARIABLES), role_variables_text(), args.check)
    return max(page, data)


if __name__ == "__main__":
    sys.exit(main())
