# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-version keys of vllm-ascend, read from ``plugins/plugin_utils/data/versions.yml``.

The table holds one row per release line ("0.23", "0.25", ..., "main"); ``version_row`` maps a
concrete version string to its line and returns a private copy of the row, so a caller that edits
the result can never change what the next caller sees (the table is parsed once and cached, but
only copies leave this module).
"""

import copy
import functools
import re


from ..shared import datafiles
from ..shared.errors import PdError

# v0.25.1rc1, 0.25.1, 0.23.0, 0.26, 0.23.0.post1, 0.26.0.dev3 -> major.minor
_VERSION_RE = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.\d+)?(?:\.?(?:rc|post|dev)\d+)?$")
_BRANCHES = ("main",)
# key -> type(s) every row must carry; checked once when the table is loaded
_ROW_KEYS = {
    "vllm_version": str,
    "offloading_spec_name": str,
    "offloading_spec_module_path": str,
    "recompute_scheduler_key": str,
    "max_num_partial_prefills_max": int,
    "max_long_partial_prefills_max": int,
    "partial_prefills_over_max": str,
    "mooncake_connectors": list,
    "mooncake_version": str,
    "kv_peer_cache": dict,
    "sources": list,
}
_CHOICES = {
    "recompute_scheduler_key": ("top", "nested"),
    "partial_prefills_over_max": ("refuse", "reset"),
}


def _check_table(table):
    """Raise PdError when the shipped table is malformed (a packaging bug, not an operator one)."""
    where = "pd_version_row"
    if not isinstance(table, dict) or not table:
        raise PdError(where, "versions.yml", "is empty or not a mapping of release lines",
                      "restore plugins/plugin_utils/data/versions.yml from the repository")
    for line, row in table.items():
        if not isinstance(line, str) or not isinstance(row, dict):
            raise PdError(where, f"versions.yml.{line}", "is not a quoted line name with a mapping",
                          "quote the line name (\"0.25\") and give it a mapping of row keys")
        for key, kind in _ROW_KEYS.items():
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise PdError(where, f"versions.yml.{line}.{key}",
                              f"{value!r} is not a {kind.__name__}",
                              "fix the row in plugins/plugin_utils/data/versions.yml")
        cache = row["kv_peer_cache"]
        if not (isinstance(cache.get("keyed_by"), list) and isinstance(cache.get("refreshed"), str)
                and isinstance(cache.get("engine_id_suffix_per_process"), bool)
                and isinstance(cache.get("sources"), list) and cache["sources"]):
            raise PdError(where, f"versions.yml.{line}.kv_peer_cache",
                          f"{cache!r} lacks keyed_by (list), refreshed, engine_id_suffix_per_process "
                          "(true/false) or sources", "fix the row in plugins/plugin_utils/data/versions.yml")
        tag = row.get("image_tag")
        if tag is not None and (not isinstance(tag, str) or not tag):
            raise PdError(where, f"versions.yml.{line}.image_tag", f"{tag!r} is not a tag or null",
                          "fix the row in plugins/plugin_utils/data/versions.yml")
        if not isinstance(row.get("image_has_jemalloc"), bool):
            raise PdError(where, f"versions.yml.{line}.image_has_jemalloc",
                          f"{row.get('image_has_jemalloc')!r} is not true or false",
                          "fix the row in plugins/plugin_utils/data/versions.yml")
        offload = row.get("offloading_connector")
        if not isinstance(offload, dict) or not isinstance(offload.get("usable"), bool) or \
                not isinstance(offload.get("reason"), str) or not offload["reason"].strip():
            raise PdError(where, f"versions.yml.{line}.offloading_connector", f"{offload!r} is not {{usable, reason}}",
                          "fix the row in plugins/plugin_utils/data/versions.yml")
        for key, choices in _CHOICES.items():
            if row[key] not in choices:
                raise PdError(where, f"versions.yml.{line}.{key}",
                              f"{row[key]!r} is not one of {', '.join(choices)}",
                              "fix the row in plugins/plugin_utils/data/versions.yml")


@functools.lru_cache(maxsize=1)
def _table():
    """Parse and check the table once. Never hand this object out: callers get deep copies."""
    table = datafiles.yaml_data("versions.yml")
    _check_table(table)
    return table


def known_versions():
    """Return the release lines of the table, in file order (e.g. ``["0.23", ..., "main"]``)."""
    return list(_table())


def _line_of(version):
    """Map a version string to its release-line key, or None when it has no recognisable form."""
    text = version.strip()
    if text.lower() in _BRANCHES:
        return text.lower()
    match = _VERSION_RE.match(text)
    if not match:
        return None
    return f"{int(match['major'])}.{int(match['minor'])}"


def offloading_lines():
    """Release lines whose OffloadingConnector works (``offloading_connector.usable``), in file order."""
    return [line for line, row in _table().items() if row["offloading_connector"]["usable"]]


def version_row(version):
    """Return a copy of the versions.yml row for ``version``, plus ``line`` (the row's key).

    Accepts "0.25.1", "v0.25.1rc1", "0.23.0", "0.26", "main". A number (YAML turned an unquoted
    0.25 into a float) and an unknown release line raise PdError naming the known lines.
    """
    where = "pd_version_row"
    known = known_versions()
    if not isinstance(version, str):
        raise PdError(where, "vllm_ascend_version",
                      f"{version!r} is a {type(version).__name__}, not a version string",
                      f'quote it in YAML, e.g. vllm_ascend_version: "0.25.1" (known lines: {", ".join(known)})')
    line = _line_of(version)
    table = _table()
    if line not in table:
        problem = (f"{version!r} is not a version string" if line is None
                   else f"{version!r} (line {line}) is not in plugins/plugin_utils/data/versions.yml")
        raise PdError(where, "vllm_ascend_version", problem,
                      f"use a release of one of the known lines: {', '.join(known)}; "
                      "for a new line, add a row to plugins/plugin_utils/data/versions.yml after checking its sources")
    row = copy.deepcopy(table[line])
    row["line"] = line
    return row
