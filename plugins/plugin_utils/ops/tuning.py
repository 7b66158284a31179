# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 4, tuning: exactly one parameter changes per step (``one_change``), the running containers
match the plan (``spec_hashes`` / ``running_drift``), and each step is recorded (``tune_record``)."""

from collections.abc import Mapping

import yaml

from ..plan import model
from ..shared import sizes
from ..shared.errors import PdError
from . import common

_MISSING = object()
_RAW_NAMES = {"cpu_offload_bytes": "cpu_offload", "shm_size_bytes": "shm_size"}


def _leaf_changes(old, new, path, out):
    if isinstance(old, Mapping) or isinstance(new, Mapping):
        if (old is _MISSING or isinstance(old, Mapping)) and (new is _MISSING or isinstance(new, Mapping)):
            left = {} if old is _MISSING else old
            right = {} if new is _MISSING else new
            for key in sorted(set(left) | set(right), key=str):
                _leaf_changes(left.get(key, _MISSING), right.get(key, _MISSING),
                              f"{path}.{key}" if path else str(key), out)
            return
    # compare values, not exact types: Ansible hands over tagged str/int/dict subclasses; only a bool
    # against a number (True == 1) is a real difference that == hides
    if old is _MISSING or new is _MISSING or isinstance(old, bool) != isinstance(new, bool) or old != new:
        out.append({"path": path,
                    "old": None if old is _MISSING else old,
                    "new": None if new is _MISSING else new,
                    "kind": "added" if old is _MISSING else "removed" if new is _MISSING else "changed"})


def _raw_path(path):
    """Normalized-cluster path -> the pd_cluster key an operator edits (roles.decode.cpu_offload_bytes ->
    decode.cpu_offload)."""
    parts = path.split(".")
    if parts[0] == "roles" and len(parts) >= 2:
        parts = parts[1:]
    return ".".join(_RAW_NAMES.get(p, p) for p in parts)


def _stated(raw, path):
    """True when the pd_cluster dict ``raw`` gives a non-null value at the dotted ``path``."""
    node = raw
    for key in path.split("."):
        if not isinstance(node, Mapping) or node.get(key) is None:
            return False
        node = node[key]
    return True


def diff_paths(before, after, effective=True):
    """Every changed leaf between two ``pd_cluster`` dicts: ``[{path, old, new, kind}]``.

    With ``effective`` (default) both are normalized first (defaults merged, sizes in bytes), so an
    explicit default or "200 GiB" for "200GiB" is no change; paths are given as the pd_cluster keys
    an operator edits (``prefill.engine.max_num_batched_tokens``, ``decode.cpu_offload``).
    """
    where = "pd_one_change"
    for name, side in (("before", before), ("after", after)):
        if not isinstance(side, Mapping):
            raise PdError(where, name, f"{type(side).__name__} is not a pd_cluster dict",
                          "pass the applied pd_cluster and the edited one")
    changes = []
    if effective:
        _leaf_changes(common.normalized(before, where), common.normalized(after, where), "", changes)
        for change in changes:
            change["path"] = _raw_path(change["path"])
        # a value neither side states is derived from a changed one (decode batched tokens from
        # max_num_seqs, recipe items from model.family): not a parameter the operator edited
        changes = [c for c in changes
                   if _stated(before, c["path"]) or _stated(after, c["path"])]
    else:
        _leaf_changes(before, after, "", changes)
    return changes


def one_change(before, after, effective=True):
    """The single parameter that differs between two ``pd_cluster`` dicts: ``{path, old, new, kind}``.

    Tuning changes exactly one parameter at a time (article §6); anything else raises ``PdError``
    that lists every changed path (or says nothing changed). See ``diff_paths`` for ``effective``.
    """
    changes = diff_paths(before, after, effective)
    if len(changes) == 1:
        return changes[0]
    if not changes:
        raise PdError("pd_one_change", "pd_cluster", "nothing changed against the applied configuration",
                      "edit exactly one parameter in group_vars/<cluster>.yml, then run again")
    shown = "; ".join(f"{c['path']}: {c['old']!r} -> {c['new']!r}" for c in changes)
    raise PdError("pd_one_change", "pd_cluster", f"{len(changes)} parameters changed ({shown})",
                  "tuning changes exactly one parameter at a time: revert all but one and run again")


def tune_check(change, param, value):
    """Check that ``one_change``'s result is the change the operator declared (``-e pd_tune_param=..
    -e pd_tune_value=..``); returns the change. ``value`` may be a string as extra vars give it
    ("32768", "true", "200GiB"): it is read as YAML, and sizes are compared in bytes."""
    where = "pd_tune_check"
    if not isinstance(change, Mapping) or "path" not in change:
        raise PdError(where, "change", "is not a pd_one_change result", "pass pd_one_change's result")
    if not isinstance(param, str) or not param:
        raise PdError(where, "pd_tune_param", f"{param!r} is not a parameter path",
                      "give the path you changed, e.g. -e pd_tune_param=prefill.engine.max_num_batched_tokens")
    if change["path"] != param:
        raise PdError(where, "pd_tune_param", f"you declared {param} but the changed parameter is "
                      f"{change['path']} ({change['old']!r} -> {change['new']!r})",
                      "declare the parameter you edited, or revert the edit")
    wanted = yaml.safe_load(value) if isinstance(value, str) else value
    got = change["new"]
    if param.rsplit(".", 1)[-1] in ("cpu_offload", "shm_size") and wanted is not None:
        wanted = sizes.to_bytes(wanted, field="pd_tune_value", where=where)
    if isinstance(got, bool) != isinstance(wanted, bool) or got != wanted:
        raise PdError(where, "pd_tune_value", f"you declared {value!r} but group_vars set {param} to {got!r}",
                      "make group_vars and -e pd_tune_value agree")
    return dict(change)


def spec_hashes(plan, cluster):
    """``{host: {container name: pd.spec-hash}}`` of a cluster's engine ranks and proxy in a fleet plan."""
    where = "pd_spec_hashes"
    if not isinstance(plan, Mapping) or cluster not in (plan.get("clusters") or {}):
        raise PdError(where, "cluster", f"{cluster!r} is not a cluster of the plan",
                      f"use one of {', '.join(sorted((plan or {}).get('clusters') or {}))}")
    out = {}
    for host in plan["clusters"][cluster]["hosts"]:
        out[host] = {spec["name"]: spec["labels"]["pd.spec-hash"] for spec in plan["hosts"][host]["specs"]}
    proxy = plan["clusters"][cluster].get("proxy")
    if proxy:
        out.setdefault(proxy["host"], {})[proxy["name"]] = proxy["labels"]["pd.spec-hash"]
    return out


def running_drift(expected, info_results):
    """Problems between recorded spec hashes and the running containers (docker_container_info loop).

    ``expected`` is ``{name: hash}``; ``info_results`` the ``.results`` of docker_container_info looped
    over those names. Returns one message per container that is absent, stopped or runs another spec.
    """
    where = "pd_running_drift"
    if not isinstance(expected, Mapping):
        raise PdError(where, "expected", f"{type(expected).__name__} is not a mapping", "pass {name: spec hash}")
    seen = {}
    for res in info_results or []:
        seen[res.get("item")] = res
    out = []
    for name, digest in expected.items():
        res = seen.get(name)
        container = (res or {}).get("container") or {}
        if not res or not res.get("exists"):
            out.append(f"{name}: not present")
            continue
        if not (container.get("State") or {}).get("Running"):
            out.append(f"{name}: not running")
        label = ((container.get("Config") or {}).get("Labels") or {}).get("pd.spec-hash")
        if label != digest:
            out.append(f"{name}: runs spec {str(label)[:12]} but {digest[:12]} was recorded")
    return out


def tune_record(change, before, after, cluster):
    """One line of build/<inventory>/reports/<cluster>/tune-history.jsonl: the change and its before/after numbers.

    ``before`` / ``after`` are ``metrics_summary`` results (per role, plus ``load``).
    """
    if not isinstance(change, Mapping) or "path" not in change:
        raise PdError("pd_tune_record", "change", "is not a pd_one_change result", "pass pd_tune_check's result")

    def headline(summary):
        summary = summary or {}
        load = summary.get("load") or {}
        return {
            "prefill_running": (summary.get("prefill") or {}).get("running"),
            "prefill_waiting": (summary.get("prefill") or {}).get("waiting"),
            "decode_running": (summary.get("decode") or {}).get("running"),
            "preemptions": sum((summary.get(r) or {}).get("preemptions") or 0.0 for r in model.ROLES),
            "ttft_p50_s": (summary.get("prefill") or {}).get("ttft_p50"),
            "ttft_p95_s": (summary.get("prefill") or {}).get("ttft_p95"),
            "client_ttft_p50_s": load.get("ttft_p50_s"),
            "throughput_tokens_per_s": load.get("throughput_tokens_per_s"),
            "requests_ok": load.get("ok"),
            "requests_failed": load.get("failed"),
        }
    return {"cluster": cluster, "param": change["path"], "old": change["old"], "new": change["new"],
            "before": headline(before), "after": headline(after), "detail": {"before": before, "after": after}}
