"""Ansible filters of pd-deploy.

The logic lives in the collection's ``plugin_utils`` package (pure functions, unit tested directly;
``ansible_collections.pd.deploy.plugins.plugin_utils``); this file only
maps filter names to those functions, plus one adapter that turns Ansible's lazy ``hostvars`` into
the plain dicts the core expects.
"""

import functools
import os

import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils import ops
from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import bootstrap, compat, netchecks, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.ops import logparse
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import capacity, connectors, fleet, versions
from ansible_collections.pd.deploy.plugins.plugin_utils.plan.fleet import HOST_VARS
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers, failures, order
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import registry, rules, secrets
from ansible_collections.pd.deploy.plugins.plugin_utils.validate.inventory import HOST_PATH_VARS

_READ = ("pd_cluster", "ansible_host", "pd_allow_idle_hosts", "pd_image_pull", "pd_image_registry",
         "pd_image_registry_username") + HOST_VARS + HOST_PATH_VARS


def _run_facts(hostvars, name):
    """Names set during this run (set_fact, register): not inventory keys, so not checked by name."""
    manager = getattr(hostvars, "_variable_manager", None)
    try:
        return set(manager._nonpersistent_fact_cache.get(name, {})) | set(manager._fact_cache.get(name, {}))
    except Exception:  # noqa: BLE001 -- private API of ansible-core; without it every key is checked
        return set()


def _origin(hostvars, name, key):
    """Where an inventory value comes from: None when given with -e (or unknown), else
    {"file": path or None, "vaulted": bool, "template": bool} (ansible-core 2.19 data tags)."""
    manager = getattr(hostvars, "_variable_manager", None)
    try:
        if key in (manager.extra_vars or {}):
            return None
        raw = hostvars.raw_get(name).get(key)
        value = hostvars[name][key]
        from ansible._internal._datatag._tags import Origin  # 2.19's source tags
        from ansible.parsing.vault import VaultHelper
        tag = Origin.get_tag(value) or Origin.get_tag(raw)
        vaulted = any(VaultHelper.get_ciphertext(v, with_tags=False) is not None for v in (raw, value))
        template = isinstance(raw, str) and ("{{" in raw or "{%" in raw)
        path = getattr(tag, "path", None) or _vars_file(hostvars, name, key)
        return {"file": path, "vaulted": vaulted, "template": template}
    except Exception:  # noqa: BLE001 -- private API of ansible-core; without it no provenance warning
        return None


@functools.lru_cache(maxsize=256)
def _top_keys(path):
    """Top-level keys of a YAML vars file (empty when it cannot be read): where an untagged value is."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except Exception:  # noqa: BLE001 -- a vault file or a broken one: the loader reports it elsewhere
        return frozenset()
    return frozenset(data) if isinstance(data, dict) else frozenset()


def _vars_file(hostvars, name, key):
    """The group_vars / host_vars file that sets ``key`` for host ``name``: a bool or a number carries
    no origin tag in ansible-core 2.19, so the inventory's own files are looked up (host first)."""
    try:
        hv = hostvars[name]
        base = hv.get("inventory_dir")
        groups = list(reversed(hv.get("group_names") or [])) + ["all"]
    except Exception:  # noqa: BLE001
        return None
    if not base:
        return None
    candidates = [os.path.join(base, "host_vars", name + ext) for ext in (".yml", ".yaml")]
    candidates += [os.path.join(base, "group_vars", g + ext) for g in groups for ext in (".yml", ".yaml")]
    return next((c for c in candidates if key in _top_keys(c)), None)


def _load_error(exc):
    """One line for a host whose variables cannot be read (a broken group_vars / host_vars file)."""
    text = " ".join(str(getattr(exc, "_original_message", None) or exc).split())
    return f"its variables cannot be read: {text}"


def fleet_input(hostvars, host_names, limit=None):
    """Plain fleet description from ``hostvars`` for ``host_names`` (inventory order).

    Only the pd_* keys the model reads are templated, so a large inventory stays cheap; the names of
    all other pd_* keys are passed for the unknown-variable check. A host whose variable files cannot
    be parsed is passed with an ``error`` instead of stopping the run at the first one.
    """
    hosts = []
    for name in host_names:
        try:
            hv = hostvars[name]
            facts = _run_facts(hostvars, name)
            keys = [k for k in hv.keys() if isinstance(k, str) and k.startswith("pd_") and k not in facts]
            data = {key: hv[key] for key in _READ if key in hv}
            if "pd_api_key" in hv:  # only its redaction enters the fleet description, never the key
                data["pd_api_key"] = secrets.host_key_fact(hv["pd_api_key"])
                origin = _origin(hostvars, name, "pd_api_key")
                if origin and not origin["vaulted"] and not origin["template"] and data["pd_api_key"]:
                    data["pd_api_key"] = dict(data["pd_api_key"], clear_in=origin["file"] or "the inventory")
            if "pd_image_registry_password" in hv:  # only whether it is set (and vaulted), never the password
                data["pd_image_registry_password"] = registry.password_fact(
                    hv["pd_image_registry_password"], _origin(hostvars, name, "pd_image_registry_password"))
            if hv.get("pd_deploy_break_lock") not in (None, False, "false", "False", "no", ""):
                origin = _origin(hostvars, name, "pd_deploy_break_lock")
                if origin:  # kept in the inventory, not given with -e for one run
                    data["pd_deploy_break_lock"] = {"kept_in": origin["file"] or "the inventory"}
            groups = list(hv.get("group_names", []))
        except Exception as exc:  # noqa: BLE001 -- AnsibleError of a YAML file, reported as a violation
            hosts.append({"name": name, "groups": [], "vars": {}, "keys": [], "error": _load_error(exc)})
            continue
        hosts.append({"name": name, "groups": groups, "vars": data, "keys": keys})
    return {"hosts": hosts, "limit": list(limit) if limit else None}


def plan_from_hostvars(hostvars, host_names, limit=None):
    """``pd_fleet_plan`` straight from Ansible's hostvars: fleet_input() then fleet.plan_fleet()."""
    return fleet.plan_fleet(fleet_input(hostvars, host_names, limit))


class FilterModule:
    """Maps filter names to the core's functions."""

    def filters(self):
        out = {}
        for module in (sizes, capacity, logparse, versions, connectors, rules, fleet, order, containers, report,
                       prechecks, ops, secrets, netchecks, failures, compat, registry, bootstrap):
            out.update(module.FILTERS)
        out["pd_fleet_input"] = fleet_input
        out["pd_plan_from_hostvars"] = plan_from_hostvars
        return out
