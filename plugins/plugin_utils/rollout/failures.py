# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Scan rank logs for the known failure lines of plugins/plugin_utils/data/known_failures.yml.

The table is data (pattern, severity, source, fix); this module only loads it, checks its shape
and matches log text against it. ``scan_logs`` is what the post-deploy task calls: one finding per
(rank, known failure), with the first matching line as evidence, never the whole log.
"""

import re

from ..shared.datafiles import yaml_data
from ..shared.errors import PdError

SEVERITIES = ("fail", "warn")
_KEYS = ("id", "pattern", "severity", "source", "fix")
_WHERE = "plugins/plugin_utils/data/known_failures.yml"


def table(data=None):
    """The known-failure entries, checked: every key present, severity fail|warn, pattern compiles, ids unique."""
    data = yaml_data("known_failures.yml") if data is None else data
    entries = (data or {}).get("failures")
    if not isinstance(entries, list) or not entries:
        raise PdError(_WHERE, "failures", "missing or empty", "list at least one known failure")
    seen = set()
    for n, entry in enumerate(entries):
        where = f"failures[{n}]"
        if not isinstance(entry, dict):
            raise PdError(_WHERE, where, f"is {type(entry).__name__}, not a mapping")
        for key in _KEYS:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise PdError(_WHERE, f"{where}.{key}", "missing or empty", "every entry needs id, pattern, "
                              "severity, source and fix")
        if "caught_by" in entry and (not isinstance(entry["caught_by"], str) or not entry["caught_by"].strip()):
            raise PdError(_WHERE, f"{where}.caught_by", "empty or not text", "name the rule or precheck, or drop the key")
        if entry["severity"] not in SEVERITIES:
            raise PdError(_WHERE, f"{where}.severity", f"{entry['severity']!r} is not fail or warn")
        try:
            re.compile(entry["pattern"])
        except re.error as exc:
            raise PdError(_WHERE, f"{where}.pattern", f"does not compile ({exc})") from exc
        if entry["id"] in seen:
            raise PdError(_WHERE, f"{where}.id", f"{entry['id']} appears twice")
        seen.add(entry["id"])
    return entries


def scan(text, entries=None):
    """Findings of one log text: ``[{id, severity, line, count, fix, source}]`` in table order.

    ``line`` is the first matching line (stripped, cut to 300 characters), ``count`` how many lines matched.
    """
    entries = table() if entries is None else entries
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise PdError("pd_known_failures", "text", f"is {type(text).__name__}, not a string")
    lines = text.splitlines()
    out = []
    for entry in entries:
        rx = re.compile(entry["pattern"])
        hits = [line for line in lines if rx.search(line)]
        if hits:
            out.append({"id": entry["id"], "severity": entry["severity"], "line": hits[0].strip()[:300],
                        "count": len(hits), "fix": entry["fix"], "source": entry["source"]})
    return out


def scan_logs(logs, entries=None):
    """Every finding of ``{rank name: log text}`` as ``{fail: [msg], warn: [msg]}``.

    Each message reads ``rank: id: "first line" (N lines) — fix``; ranks in name order.
    """
    if not isinstance(logs, dict):
        raise PdError("pd_known_failures", "logs", f"is {type(logs).__name__}, not a mapping of rank name to log text")
    entries = table() if entries is None else entries
    out = {"fail": [], "warn": []}
    for name in sorted(logs):
        for f in scan(logs[name], entries):
            times = f" ({f['count']} lines)" if f["count"] > 1 else ""
            out[f["severity"]].append(f"{name}: {f['id']}: \"{f['line']}\"{times} — {f['fix']}")
    return out


def markdown_table(entries=None):
    """The known-failure table of docs/guide/troubleshoot.md (pattern, severity, caught before start by, fix, source), one row per entry."""
    entries = table() if entries is None else entries
    rows = ["| Log line (regex) | Severity | Caught before start by | Fix | Source |", "|---|---|---|---|---|"]
    for e in entries:
        cells = [f"`{e['pattern']}`", e["severity"], e.get("caught_by") or "scan only", e["fix"], e["source"]]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def proxy_answer_problems(name, result):
    """Problems of one end-to-end completion through a proxy (an ansible ``uri`` result), as messages.

    A 200 is not enough: vllm-ascend's example proxy answered HTTP 200 with an empty body when decode
    failed (vllm-project/vllm-ascend issues 12166 and 13140, fixed by PR 12168), so the body must be JSON
    with at least one choice carrying text.
    """
    if not isinstance(result, dict):
        raise PdError("pd_proxy_answer_problems", "result", f"is {type(result).__name__}, not a uri result")
    status = result.get("status")
    fix = ("read the decode ranks' logs (playbooks/collect_logs.yml) and the proxy's; a decode rank that "
           "failed or refused the request is the usual cause")
    if status != 200:
        why = result.get("msg") or "no answer"
        return [f"{name}: completion through the proxy answered HTTP {status} ({why}) — {fix}"]
    body = result.get("json")
    if not body and not (result.get("content") or "").strip():
        return [f"{name}: completion through the proxy answered HTTP 200 with an empty body (the proxy swallowed a "
                f"decode failure, vllm-ascend issue 13140) — {fix}"]
    choices = (body or {}).get("choices") if isinstance(body, dict) else None
    if not choices:
        return [f"{name}: completion through the proxy answered HTTP 200 without choices — {fix}"]
    if not any((c.get("text") or (c.get("message") or {}).get("content") or "") for c in choices
               if isinstance(c, dict)):
        return [f"{name}: completion through the proxy answered HTTP 200 with empty text in every choice — {fix}"]
    return []
