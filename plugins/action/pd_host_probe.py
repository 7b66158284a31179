"""Action plugin of the pd_host_probe module: the deploy lock it may take before it reads the host.

Without ``lock`` the module runs as it is. With it (the rollout's read of the host that keeps its
cluster's deploy lock: roles/pd_rollout), this plugin fills in this run as the holder and judges a lock
held by another run as pd_deploy_lock's action plugin does (the same functions): refused, naming the
holder and the way out, or broken when pd_deploy_break_lock asks and the holder is not alive; then the
module runs again with ``force`` and reads the host after it took the lock.
"""

from ansible.plugins.action import ActionBase

from ansible_collections.pd.deploy.plugins.action.pd_deploy_lock import broke, decide, run_of


class ActionModule(ActionBase):
    """Fills in the lock's holder; refuses (or, when asked, breaks) a lock held by another run."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        module = self._task.action or "pd_host_probe"
        lock = dict(args.get("lock") or {})
        if not lock:
            result.update(self._execute_module(module, module_args=args, task_vars=task_vars))
            return result
        host = task_vars.get("inventory_hostname", "?")
        run = run_of(task_vars)
        args["lock"] = dict(lock, holder=run, force=False)
        got = self._execute_module(module, module_args=args, task_vars=task_vars)
        taken = got.get("lock") or {}
        state = decide(dict(taken, failed=got.get("failed")), lock.get("cluster"), host, run,
                       task_vars.get("pd_deploy_break_lock", False))
        if state is not None:
            holder = taken["holder"]
            got = self._execute_module(module, module_args=dict(args, lock=dict(args["lock"], force=True)),
                                       task_vars=task_vars)
            if (got.get("lock") or {}).get("acquired"):
                got["lock"]["msg"] = broke(lock.get("cluster"), holder, state)
        if isinstance(got.get("lock"), dict):
            got["lock"]["host"] = host
        result.update(got)
        return result
