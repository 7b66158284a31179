# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: read one host with pd_host_probe and judge what it read, in one task (pd_prechecks).

The probe's arguments come from the host's plan entry (``plugin_utils.hostcheck.verdict.probe_request``),
the module runs on the host as before, and the host's own problems and Docker warnings are judged here
on the controller (``verdict.host_judgement``) and added to the result as ``problems`` and
``docker_warnings``. The task does not fail on them: pd_prechecks_decide, once for the play, fails with
every host's problems at once. A host that cannot be reached, or whose probe fails, fails here as before.

It was two tasks (the probe, then a check per host whose Jinja computed the problems twice); the second
was a worker process per host on every run, the no-op re-run's too (issue 24). With ``check_role_options``
it also checks, first, the variables of its role's entry point against the role's meta/argument_specs.yml,
as the argument check Ansible prepends to a role would (same validator, same message): playbooks/prechecks.yml
includes pd_prechecks with ``rolespec_validate: false`` and saves that task, a worker process per host.
Documented in plugins/modules/pd_host_check.py (ansible-doc reads a module's docs there).
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import verdict
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.controller import role_options
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.errors import PdError

_VALID = frozenset(("host_plan", "vllm_ascend_version", "docker_socket", "ascend_root", "skip", "hccn", "compat",
                    "docker_daemon_json", "min_free_disk", "probe_timeout", "probe_interval", "check_role_options"))


def options(args):
    """The task's arguments, checked: {name: value}; raises ValueError naming the argument and the fix."""
    plan = args.get("host_plan")
    if not isinstance(plan, dict) or "specs" not in plan or "model_path" not in plan:
        raise ValueError("host_plan: expected this host's entry of the fleet plan (pd_plan_fleet.hosts[host])")
    if not args.get("docker_socket"):
        raise ValueError("docker_socket: required — the Docker Engine API socket on the host (pd_docker_socket)")
    out = {"host_plan": plan, "docker_socket": str(args["docker_socket"]),
           "ascend_root": str(args.get("ascend_root") or ""),
           "docker_daemon_json": str(args.get("docker_daemon_json") or "/etc/docker/daemon.json"),
           "min_free_disk": args.get("min_free_disk", "10GiB"),
           "vllm_ascend_version": args.get("vllm_ascend_version")}
    for name, default in (("skip", False), ("hccn", True), ("compat", True)):
        try:
            out[name] = boolean(args.get(name, default), strict=True)
        except TypeError as exc:
            raise ValueError(f"{name}: {args.get(name)!r} is not a boolean — give true or false") from exc
    for name, default in (("probe_timeout", 15), ("probe_interval", 3)):
        try:
            out[name] = int(args.get(name, default))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: {args.get(name)!r} is not a whole number of seconds") from exc
    return out


class ActionModule(ActionBase):
    """``pd_host_check: {host_plan, docker_socket, ...}`` (plugins/modules/pd_host_check.py)."""

    TRANSFERS_FILES = False
    _VALID_ARGS = _VALID
    # the probe only reads; under --check it runs as well (what runs is needed to say what a deploy would do)
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        host = task_vars.get("inventory_hostname", "?")
        entry = self._task.args.get("check_role_options")
        if entry:
            errors = role_options(self, "pd_host_check", str(entry), task_vars)[0]
            if errors:
                result.update(failed=True, argument_errors=errors,
                              msg="Validation of arguments failed:\n" + "\n".join(errors))
                return result
        try:
            opts = options(self._task.args)
        except ValueError as exc:
            raise AnsibleActionFail(f"pd_host_check: {host}: {exc}") from exc
        request = verdict.probe_request(opts["host_plan"], opts["docker_socket"], opts["ascend_root"], opts["skip"],
                                        opts["hccn"], opts["compat"], opts["docker_daemon_json"],
                                        opts["probe_timeout"], opts["probe_interval"])
        probe = self._execute_module("pd.deploy.pd_host_probe", module_args=request, task_vars=task_vars)
        result.update(probe)
        if not verdict.read(probe):
            return result
        try:
            result.update(verdict.host_judgement(host, opts["host_plan"], probe, opts["skip"], opts["compat"],
                                                 opts["min_free_disk"], opts["vllm_ascend_version"]))
        except PdError as exc:
            raise AnsibleActionFail(f"pd_host_check: {exc}") from exc
        return result
