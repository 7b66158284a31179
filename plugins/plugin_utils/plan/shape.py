# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shape check of the inventory: JSON Schema errors (plugins/plugin_utils/schemas/*.schema.json) as violations an
operator can act on, with dotted field paths, numbers quoted by mistake and NaN named as such."""

import functools
import math

try:
    import jsonschema
    import jsonschema.validators
except ImportError:  # the collection's requirements.txt; the first shape check says so (_validator_class)
    jsonschema = None

from ..shared import datafiles, sizes
from ..shared.errors import PdError
from ..validate.violation import violation


def schema(name):
    """A fresh copy of ``plugins/plugin_utils/schemas/<name>``."""
    return datafiles.schema(name)


def _strict_integer(checker, instance):
    """JSON Schema "integer" as the engines read it: an int, not a bool, not a float.

    Since draft 6 JSON Schema calls 8000.0 an integer (jsonschema 4.26.0 jsonschema/_types.py
    draft6_type_checker accepts a float whose fraction is 0), but YAML's ``8000.0`` is a Python float:
    rendered it becomes ``--port 8000.0``, which vLLM's argparse ``int`` / ``human_readable_int`` (vllm@v0.27.1
    vllm/utils/argparse_utils.py) and the
    proxy's ``type=int`` refuse at start, and every rule that compares ints skipped it. Refused, not
    normalized to 8000: the operator sees the value they wrote in the plan, the rules and the renderer
    keep one type, and ``8000.5`` must be refused anyway (docs/guide/inventory.md "What validation refuses").
    """
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.lru_cache(maxsize=None)
def _validator_class(where):
    """Draft 2020-12 with the strict integer above (every schema of pd-deploy is checked with it).

    Built on first use, so that the filters load on a controller without jsonschema and the plan then
    names the missing package, instead of Ansible skipping the whole filter plugin ("No filter named").
    """
    if jsonschema is None:
        raise PdError(where, "jsonschema", "the package is not installed on the controller",
                      "pip install -r requirements.txt of the collection pd.deploy (jsonschema>=4.26.0)")
    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer))


def _number_text(value):
    """True for a string that reads as a number (``"8000"``, ``" 0.85 "``): quoted in YAML by mistake."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str) and value.strip().lower().lstrip("+-") not in ("nan", "inf", "infinity")


def _type_explained(err, schema_name):
    """(message, fix) of a number of the wrong type, or None for other type errors."""
    expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    value = err.instance
    if "integer" in expected and isinstance(value, float):
        if value.is_integer():
            return (f"{value!r} is a float, the field takes a whole number: rendered it would read "
                    f"{value!r}, which vLLM's and the proxy's int parsers refuse at start",
                    f"write {int(value)} (see plugins/plugin_utils/schemas/{schema_name})")
        return f"{value!r} is not a whole number", f"write a whole number (see plugins/plugin_utils/schemas/{schema_name})"
    if ("integer" in expected or "number" in expected) and _number_text(value):
        kind = "a whole number" if "integer" in expected else "a number"
        return (f"{value!r} is quoted text, the field takes {kind}",
                f"write {value.strip()} without quotes (see plugins/plugin_utils/schemas/{schema_name})")
    return None


def _non_finite(instance, path=()):
    """Paths of every NaN / infinite float in a YAML value (JSON Schema's bounds let NaN through)."""
    if isinstance(instance, float) and not math.isfinite(instance):
        yield path
    elif isinstance(instance, dict):
        for key, value in instance.items():
            yield from _non_finite(value, path + (str(key),))
    elif isinstance(instance, list):
        for index, value in enumerate(instance):
            yield from _non_finite(value, path + (str(index),))


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_size_schema(schema_part):
    return isinstance(schema_part, dict) and schema_part.get("title") == "size"


def _explain(err, schema_name):
    """(message, fix) of one JSON Schema error in words an operator can act on."""
    subschema = err.schema if isinstance(err.schema, dict) else {}
    sizes_involved = _is_size_schema(subschema) or any(_is_size_schema(e.schema) for e in err.context or [])
    if sizes_involved and isinstance(err.instance, float) and err.instance.is_integer() and err.instance >= 0:
        whole = int(err.instance)
        return (f"{err.instance!r} is a float: a size is an integer byte count or a number with a unit",
                f"write {whole} or {sizes.to_human(whole)}")
    if sizes_involved and err.instance is not None:
        try:
            sizes.to_bytes(err.instance, field="size", where="schema")
        except PdError as exc:
            return exc.problem, exc.fix
        return (f"{_shown(err.instance)} is not a size here", f"write {sizes.GRAMMAR}")
    description = subschema.get("description")
    if err.validator == "type":
        typed = _type_explained(err, schema_name)
        if typed:
            return typed
    if err.validator in ("oneOf", "anyOf"):
        kinds = [c.get("type") or c.get("enum") or c.get("title") for c in err.validator_value
                 if isinstance(c, dict)]
        expected = description or " or ".join(str(k) for k in kinds if k)
        return (f"{_shown(err.instance)} is not valid: expected {expected}",
                f"see plugins/plugin_utils/schemas/{schema_name} for the accepted values")
    if err.validator == "pattern":
        expected = description or f"text matching {err.validator_value}"
        return f"{_shown(err.instance)} is not valid: expected {expected}", f"see plugins/plugin_utils/schemas/{schema_name}"
    if err.validator == "propertyNames":
        return (f"{_shown(err.instance)} has a key that is not valid: {description or err.message}",
                f"see plugins/plugin_utils/schemas/{schema_name}")
    message = err.message
    if description and err.validator in ("type", "minimum", "maximum", "minLength", "enum", "not"):
        message = f"{message} ({description})"
    return message, f"see plugins/plugin_utils/schemas/{schema_name} for the accepted values"


def shape_violations(instance, schema_name, where, prefix=""):
    """Every JSON Schema error of ``instance`` as a violation, with a dotted field path."""
    validator = _validator_class(where)(schema(schema_name))
    out = []
    for path in _non_finite(instance):
        field = ".".join(p for p in (prefix, *path) if p)
        out.append(violation("error", where, field, "is not a finite number (NaN or infinity)", "write a finite number"))
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in err.absolute_path)
        if isinstance(err.instance, float) and not math.isfinite(err.instance):
            continue  # reported above, once
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            # one violation per unknown key, named by its full path (prefill.engine.blok_size)
            known = (err.schema or {}).get("properties") or {}
            for key in [k for k in err.instance if k not in known]:
                field = ".".join(str(p) for p in (prefix, path, key) if p)
                out.append(violation("error", where, field, f"unknown key {key!r}",
                                     "remove or rename the key (see inventories/example for the accepted keys)"))
            continue
        if err.validator == "required":
            # one violation per missing key, each named (a missing model is reported as model)
            for key in [k for k in err.validator_value if k not in (err.instance or {})]:
                field = ".".join(p for p in (prefix, path, key) if p)
                out.append(violation("error", where, field, "missing (required, no default)",
                                     f"add the key {key} (see inventories/example)"))
            continue
        field = ".".join(p for p in (prefix, path) if p) or prefix or "(top level)"
        message, fix = _explain(err, schema_name)
        out.append(violation("error", where, field, message, fix))
    return out
