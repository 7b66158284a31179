"""Action plugin of the pd_deploy_lock module: who this run is, and whether another holder is live.

The module runs on the cluster's lock host and only takes, reports or gives back the lock file. This
plugin runs on the controller, so it can name this run (controller, user, ansible-playbook's process id
and that process's start time) and tell, for a lock held by another run of this same controller,
whether that run still exists. A lock held by another run:

- live (its process runs on this controller and is provably the same process: its start time matches
  the one recorded) -> refused, even with pd_deploy_break_lock;
- stale (its process is gone: killed, or its host was lost before it could give the lock back; or its
  process id now belongs to another process), unproven (a process has its id but the record has no
  start time, written where /proc is absent or by an older pd-deploy, or /proc cannot be read: the
  holder cannot be proven alive) or held from another controller (cannot be checked from here) ->
  refused with the holder named, why, and the way to break it: -e pd_deploy_break_lock=true. A lock
  is never broken without that flag.

``pd_deploy_break_lock`` may also NAME the holder to break: its run id (``<controller>:<pid>:<start>``,
printed in the refusal) or, for a run of an AWX / Automation Platform job, the job's id (``awx_job_id``,
recorded as ``job``). Then only a lock held by that run is broken (unless it is live here); a lock held
by any other run, such as a live job on another controller, is refused as without the flag. That is the
way to release the lock of a killed job, whose controller (the job's pod) is gone and cannot be checked,
without the blanket switch that would also break the lock of a job running elsewhere.
"""

import datetime
import getpass
import os
import socket

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def process_start(pid):
    """Start time of ``pid`` in clock ticks since boot (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


#: the values of pd_deploy_break_lock read as the switch (anything else names a holder)
_SWITCH = {"true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f", ""}


def break_request(value):
    """(break any non-live holder, the holder named or None) from ``pd_deploy_break_lock``: a boolean is
    the switch; another text names the run id or AWX job id of the one holder to break."""
    if value is None or isinstance(value, bool) or str(value).strip().lower() in _SWITCH:
        return boolean(value if value is not None else False, strict=False), None
    return False, str(value).strip()


def names_holder(holder, named):
    """Whether ``named`` is the holder's run id or its AWX job id."""
    if not holder or not named:
        return False
    return named in (str(holder.get("run_id") or ""), str(holder.get("job") or ""),
                     f"awx-{holder.get('job')}" if holder.get("job") else "")


def job_of(task_vars):
    """The AWX / Automation Platform job id of this run (its extra vars awx_job_id / tower_job_id), or None."""
    for key in ("awx_job_id", "tower_job_id"):
        value = (task_vars or {}).get(key)
        if value not in (None, ""):
            return str(value)
    return None


def this_run(now=None):
    """The holder record of this ansible-playbook run (the workers' parent process)."""
    pid = os.getppid()
    start = process_start(pid)
    controller = socket.gethostname()
    started = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"run_id": f"{controller}:{pid}:{start}", "controller": controller, "user": user, "pid": pid,
            "pid_start": start, "started": started}


def process_name(pid):
    """The program name of ``pid`` (Linux /proc/<pid>/comm), or None."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def holder_state(holder, controller, alive=None):
    """``live``, ``stale``, ``unproven`` or ``unknown`` (another controller, or an unreadable lock file).

    Live only when the process exists AND is provably the holder: its start time equals the recorded
    one. A process under the recorded id whose start time cannot be compared (none recorded: a lock
    written where /proc is absent or by an older pd-deploy; or /proc unreadable now) is ``unproven``:
    any process that reuses the id would otherwise keep the lock forever.
    """
    if not holder or holder.get("controller") != controller or not isinstance(holder.get("pid"), int):
        return "unknown"
    return (alive or _alive)(holder["pid"], holder.get("pid_start"))


def _alive(pid, start):
    """``live``, ``stale`` (no such process, or another one under that id) or ``unproven``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "stale"
    except PermissionError:
        pass
    now = process_start(pid)
    if start is None or now is None:
        return "unproven"
    return "live" if now == start else "stale"


def describe(holder):
    if not holder:
        return "an unreadable lock file (a run killed while writing it)"
    job = f", AWX job {holder['job']}" if holder.get("job") else ""
    return (f"{holder.get('user', '?')}@{holder.get('controller', '?')}, ansible-playbook pid {holder.get('pid', '?')}, "
            f"started {holder.get('started', '?')}{job}")


def holder_name(holder):
    """What to give pd_deploy_break_lock to break this holder's lock alone: its AWX job id, else its run id."""
    if not holder:
        return ""
    return str(holder.get("job") or holder.get("run_id") or "")


def pid_now(holder, name=None):
    """What runs under the holder's process id now, when it is not ansible-playbook (reused id), else ''."""
    if name is None and isinstance((holder or {}).get("pid"), int):
        name = process_name(holder["pid"])
    if not name or name.startswith("ansible"):
        return ""
    return f" Process id {holder['pid']} now belongs to another program ({name})."


# why a lock could be broken, for the warning that names the broken holder
BROKEN_WHY = {
    "stale": "its process is gone from this controller",
    "unproven": "its process cannot be proven alive: no start time to compare with the process under its id",
    "unknown": "held from another controller or unreadable, not checkable from here",
}


def refusal(cluster, lock_host, path, holder, state, break_asked, named=None):
    """The message of a deploy that finds the cluster locked by another run (``named``: the holder that
    pd_deploy_break_lock named, when it is not this one)."""
    who = describe(holder)
    head = f"cluster {cluster}: its deploy lock ({lock_host}:{path}) is held by another run: {who}."
    if state == "live":
        extra = (" That run is still going on this controller; wait for it to end" +
                 (" (pd_deploy_break_lock does not break the lock of a run that is alive)." if break_asked else "."))
        return head + extra
    if state == "stale":
        why = ("That process is gone from this controller: the run was killed or lost its hosts before it "
               "could give the lock back, and may have left a replacement half done (the next deploy "
               "finishes it or restores the previous container).")
    elif state == "unproven":
        why = ("A process has that id on this controller, but it cannot be proven to be that run: "
               + ("the lock records no process start time (written where /proc is absent, or by an older "
                  "pd-deploy)" if holder.get("pid_start") is None else
                  "its start time cannot be read (/proc absent or unreadable)")
               + "; if no deploy of this cluster runs,")
    else:
        why = ("It cannot be checked from this controller; if no deploy of this cluster runs (check "
               f"with {holder.get('user', 'its user') if holder else 'its owner'} on "
               f"{holder.get('controller', 'that controller') if holder else 'the controller that ran it'}),")
    name = holder_name(holder)
    only = (f" (or -e pd_deploy_break_lock={name} to break this run's lock and no other)" if name else "")
    other = (f" pd_deploy_break_lock names {named}, not this holder (run id {holder.get('run_id', '?')}"
             + (f", AWX job {holder['job']}" if holder.get("job") else "") + "): nothing was broken."
             if named and holder else "")
    return (f"{head}{pid_now(holder) if state != 'unknown' else ''}{other} {why} Re-run with -e pd_deploy_break_lock=true"
            f" to break it{only}; this cluster was not touched.")


class ActionModule(ActionBase):
    """Fills in the holder; refuses (or, when asked, breaks) a lock held by another run."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        break_any, named = break_request(args.pop("break_lock", task_vars.get("pd_deploy_break_lock", False)))
        host = args.pop("lock_host", None) or task_vars.get("inventory_hostname", "?")
        run = task_vars.get("_pd_deploy_lock_run") or this_run()
        job = job_of(task_vars)
        if job and not run.get("job"):
            run = dict(run, job=job)
        args["holder"] = run
        module = self._task.action or "pd_deploy_lock"
        got = self._execute_module(module, module_args=args, task_vars=task_vars)
        mode = args.get("state", "acquired")
        holder = got.get("holder")
        # released, ours, or free (a check, or check mode): nothing to refuse
        if got.get("failed") or mode == "released" or got.get("acquired") or holder is None:
            result.update(got)
            return result
        state = holder_state(holder, run["controller"])
        # the switch breaks any holder that is not live; a name only the holder it names
        break_asked = break_any or names_holder(holder, named)
        if break_asked and state != "live" and mode == "checked":
            result.update(got)
            return result
        if break_asked and state != "live":
            got = self._execute_module(module, module_args=dict(args, force=True), task_vars=task_vars)
            if got.get("acquired"):
                got["msg"] = (f"broke the deploy lock of cluster {args.get('cluster')} held by {describe(holder)} "
                              f"({BROKEN_WHY[state]}){pid_now(holder) if state != 'unknown' else ''}")
                display.warning(got["msg"])
            result.update(got)
            return result
        # lock_refused: the deploy's report says this cluster was not touched, held by that run
        raise AnsibleActionFail(refusal(args.get("cluster"), host, got.get("path"), holder, state, break_asked,
                                        None if break_asked else named),
                                result={"lock_refused": True, "cluster": args.get("cluster"), "holder": holder,
                                        "holder_state": state, "held_by": describe(holder)})
