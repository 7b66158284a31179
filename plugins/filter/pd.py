# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ansible filters of pd-deploy: the collection's public filter surface.

``FilterModule.filters()`` lists by hand every filter that a role, a playbook, a Molecule scenario or the
docs apply, each with its ansible-doc page ``plugins/filter/<name>.yml``; nothing else is a filter
(tests/unit/plugins/filter/test_filter_docs.py fails on a filter without a use or without a page). The
logic lives in the collection's ``plugin_utils`` package (pure functions, unit tested directly;
``ansible_collections.pd.deploy.plugins.plugin_utils``); the helpers the filters build on stay plain
functions there. This file only maps names to functions, plus one adapter that turns Ansible's lazy
``hostvars`` into the plain dicts the core expects.
"""

import functools
import os

import yaml

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import bootstrap, netchecks, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.ops import (
    baseline, capacity_report, diagnosis, gate, metrics, monitoring, remove, tuning)
from ansible_collections.pd.deploy.plugins.plugin_utils.plan import fleet
from ansible_collections.pd.deploy.plugins.plugin_utils.plan.fleet import HOST_VARS
from ansible_collections.pd.deploy.plugins.plugin_utils.report import refusal
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers, failures, order, selection
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes
from ansible_collections.pd.deploy.plugins.plugin_utils.validate import registry, secrets
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
    """The public filters, by stage of a run; each has its page plugins/filter/<name>.yml."""

    def filters(self):
        return {
            # plan: the whole plan from the inventory; sizes an operator writes
            "pd_plan_from_hostvars": plan_from_hostvars,
            "pd_to_bytes": sizes.to_bytes,
            "pd_secret_env": secrets.secret_env,
            "pd_auth_headers": secrets.auth_headers,
            # host checks
            "pd_required_paths": prechecks.required_paths,
            "pd_hccn_ping_request": netchecks.ping_request,
            "pd_hccn_ping_problems": netchecks.ping_problems,
            "pd_driver_problems": prechecks.driver_problems,
            # images from a registry (pd_image), the host bootstrap (pd_bootstrap)
            "pd_pull_hosts": registry.pull_hosts,
            "pd_pulled_images": registry.pulled_images,
            "pd_pull_lines": registry.pull_lines,
            "pd_docker_daemon_config": bootstrap.daemon_config,
            "pd_limits_conf": bootstrap.limits_conf,
            # rollout: order, containers, known failures
            "pd_entry_options": order.entry_options,
            "pd_lock_hosts": order.lock_hosts,
            "pd_rollout_waves": order.rollout_waves,
            "pd_tag_selection": selection.tag_selection,
            "pd_batch_probes": order.batch_probes,
            "pd_host_specs": containers.host_specs,
            "pd_replacement_plan": containers.replacement_plan,
            "pd_start_requests": containers.start_requests,
            "pd_health_checks": containers.health_checks,
            "pd_unhealthy_specs": containers.unhealthy_specs,
            "pd_rollback_message": containers.rollback_message,
            "pd_wiring_message": containers.wiring_message,
            "pd_orphans": containers.orphans,
            "pd_docker_logs": containers.docker_logs,
            "pd_known_failures": failures.scan_logs,
            "pd_proxy_answer_problems": failures.proxy_answer_problems,
            # report
            "pd_inventory_slug": report.inventory_slug,
            "pd_rollout_summary": report.rollout_summary,
            "pd_rollout_failed_hosts": report.failed_hosts,
            "pd_rollout_failure_message": report.failure_message,
            "pd_deploy_refusal": refusal.refusal,
            # operations (playbooks/health_check.yml, baseline.yml, capacity_report.yml, token_gate.yml,
            # tune.yml, monitoring.yml)
            "pd_parse_metrics": metrics.parse_metrics,
            "pd_metrics_window": metrics.metrics_window,
            "pd_metrics_summary": diagnosis.metrics_summary,
            "pd_diagnose": diagnosis.diagnose,
            "pd_health_ranks": diagnosis.health_ranks,
            "pd_health_clusters": diagnosis.health_clusters,
            "pd_gate_answers": gate.gate_answers,
            "pd_token_gate": gate.token_gate,
            "pd_gate_message": gate.gate_message,
            "pd_one_change": tuning.one_change,
            "pd_tune_check": tuning.tune_check,
            "pd_tune_record": tuning.tune_record,
            "pd_spec_hashes": tuning.spec_hashes,
            "pd_running_drift": tuning.running_drift,
            "pd_baseline_spec": baseline.baseline_spec,
            "pd_baseline_boots": baseline.baseline_boots,
            "pd_baseline_failure": baseline.baseline_failure,
            "pd_image_identity": baseline.image_identity,
            "pd_baseline_report": baseline.baseline_report,
            "pd_baseline_markdown": baseline.baseline_markdown,
            "pd_capacity_reports": capacity_report.capacity_reports,
            "pd_capacity_report_files": capacity_report.capacity_report_files,
            "pd_prometheus_scrape_config": monitoring.prometheus_scrape_config,
            "pd_grafana_dashboard": monitoring.grafana_dashboard,
            "pd_remove_hosts_plan": remove.remove_hosts_plan,
        }
