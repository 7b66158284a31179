# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: judge the fleet plan and write its reports, on the controller, in one task.

pd_plan used to do this in five tasks (refuse the inventory, name it, show the violations, fail, write
the files, show the capacity), each a worker process and about 0.2 s even when it only skipped; a no-op
re-run paid them all. This does the same in-process, in the same order, with the same texts:

1. a run that cannot be planned fails first, before anything is written: an inventory without a cluster,
   the embedded demo inventory where containers would start, deploy-pd.yml's bad rollout batch size
   (pd_cluster_batch) (``plugin_utils.report.summary.plan_problem``, the function of the filter
   pd_plan_problem, whose text deploy-pd.yml reports after such a refusal);
2. the inventory's name (``inventory_note``) comes with every other result;
3. a plan that breaks a rule fails, nothing written: its msg the counts (Ansible 2.19 prints a failed
   task's msg twice, as the old fail task's), every violation once in ``violations`` below it;
4. else plan.json, the capacity summaries and (render-only) the launch specs are written with the code
   of the pd_write_files action (same manifest, same removal of the last run's files), and the result
   shows the capacity summary (``msg``) and the warnings, if any (``violations``).

Documented in plugins/modules/pd_plan_check.py (ansible-doc reads a module's docs there).
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display

from ansible_collections.pd.deploy.plugins.action import pd_write_files
from ansible_collections.pd.deploy.plugins.plugin_utils.report import summary as report
from ansible_collections.pd.deploy.plugins.plugin_utils.shared.controller import ControllerAction

display = Display()
_VALID = frozenset(("plan", "inventory", "cluster_hosts", "demo", "refuse_demo", "build_dir", "render_specs",
                    "cluster_batch", "parallel_clusters"))


def check(plan, inventory, cluster_hosts, demo=False, refuse_demo=False, build_dir="", render_specs=False,
          write=None, cluster_batch=None, parallel_clusters=False, dry_run=False):
    """The task's result: {failed, msg[, inventory, violations]} or {msg (the capacity lines), inventory,
    changed, written, removed[, violations (the warnings)][, owner_was]}.

    ``write(files, root, owner)`` -> (changed, removed, previous owner) is pd_write_files' sync_files;
    with an empty ``build_dir`` nothing is written (pd_plan_write_reports: false). ``cluster_batch``
    (deploy-pd.yml's pd_cluster_batch; None: not given) is refused with the inventory's problems
    (``report.plan_problem``), before the plan's rules, anything written and any host probed. With ``dry_run`` (--check) ``write`` is pd_write_files'
    preview_files: nothing is written, the result says what would change (``would_write``, ``would_remove``).
    """
    problem = report.plan_problem(inventory, cluster_hosts, demo, refuse_demo, cluster_batch, parallel_clusters)
    if problem:
        return {"failed": True, "msg": problem}
    note = report.inventory_note(inventory, cluster_hosts, demo)
    if not isinstance(plan, dict) or not isinstance(plan.get("messages"), list) or "clusters" not in plan:
        return {"failed": True, "inventory": note,
                "msg": "pd_plan_check: plan: expected the fleet plan of pd_plan_from_hostvars (pd_plan_fleet)"}
    if not plan.get("ok"):
        # the counts as msg (Ansible prints a failed task's msg twice), every violation once below it
        return {"failed": True, "inventory": note, "msg": report.plan_failure_message(plan),
                "violations": report.plan_report(plan)}
    result = {"changed": False, "inventory": note, "written": 0, "removed": []}
    if build_dir:
        files = report.build_files(plan, build_dir, render_specs)
        owner = ", ".join(str(s) for s in inventory or [])
        changed, removed, old_owner = write(files, build_dir, owner)
        if old_owner and owner and old_owner != owner:
            result["owner_was"] = old_owner
        if dry_run:
            del result["written"], result["removed"]
            result.update(changed=bool(changed or removed), would_write=changed, would_remove=removed,
                          check_mode=f"--check: nothing written under {build_dir} ({len(changed)} file(s) would "
                                     f"change, {len(removed)} would be removed)")
        else:
            result.update(changed=bool(changed or removed), written=len(changed), removed=removed)
    if plan["messages"]:
        # one block of text (printed unwrapped, a warning on one line), as the failure's
        result["violations"] = report.plan_report(plan)
    result["msg"] = report.capacity_lines(plan)
    return result


class ActionModule(ControllerAction):
    """``pd_plan_check: {plan, inventory, cluster_hosts, demo, refuse_demo, build_dir, render_specs,
    cluster_batch, parallel_clusters}``."""

    # under --check nothing is written: the result says which files would change (pd_write_files.preview_files)
    _VALID_ARGS = _VALID
    PLUGIN = "pd_plan_check"
    REQUIRED = ("plan", "inventory", "cluster_hosts")

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._required_args()
        inventory = args["inventory"]
        inventory = [inventory] if isinstance(inventory, str) else list(inventory or [])
        try:
            hosts = int(args["cluster_hosts"])
            flags = {k: boolean(args.get(k, False), strict=True)
                     for k in ("demo", "refuse_demo", "render_specs", "parallel_clusters")}
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"pd_plan_check: {exc} — cluster_hosts is a number, demo, refuse_demo and "
                                    "render_specs, parallel_clusters are booleans") from exc
        build_dir = str(args.get("build_dir") or "")
        try:
            out = check(args["plan"], inventory, hosts, flags["demo"], flags["refuse_demo"], build_dir,
                        flags["render_specs"],
                        write=pd_write_files.preview_files if self._play_context.check_mode else pd_write_files.sync_files,
                        cluster_batch=args.get("cluster_batch"), parallel_clusters=flags["parallel_clusters"],
                        dry_run=bool(self._play_context.check_mode))
        except ValueError as exc:
            raise AnsibleActionFail(f"pd_plan_check: build_dir: {exc} — write under build_dir") from exc
        except OSError as exc:
            raise AnsibleActionFail(f"pd_plan_check: {exc.filename}: {exc.strerror} — check the build directory "
                                    "(pd_plan_build_dir)") from exc
        old_owner = out.pop("owner_was", None)
        if old_owner:  # pd_write_files' warning, word for word
            display.warning(f"{build_dir} held the output of inventory {old_owner}; "
                            + ("--check: it would be replaced by" if self._play_context.check_mode else "replaced by")
                            + f" the output of {', '.join(map(str, inventory))} (-e pd_plan_build_dir=<dir> keeps both)")
        result.update(out)
        # shown like debug's msg: the inventory checked, the capacity summary and the warnings
        result["_ansible_verbose_always"] = True
        return result
