# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin of the pd_http_wait module: the same wait, with a progress line every ``progress_s``.

A module cannot print while it runs, so a 10-minute model load used to show nothing until the task
ended. This plugin runs on the controller and runs the module in slices (``slice_s``): each module
run polls like before, but returns after about ``progress_s`` seconds with the checks still within
their deadline marked ``pending``; the plugin prints which ranks are still loading, with the time
waited and the timeout, and runs the module again for those, each with the time it has left. The
deadlines are those of a single run: each check's ``timeout_s`` counts from the start of the task.

Cost: a wait that ends within the first ``progress_s`` is one module run, as before; a long one
adds one module run per ``progress_s`` (default 60 s). No checks: no module run at all.
``progress_s`` comes from the task, else the variable ``pd_health_progress_s``, else 60; 0 gives
one module run and no progress line.
"""

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
DEFAULT_PROGRESS_S = 60.0


def duration(seconds):
    """``75`` -> ``1m 15s``; ``3725`` -> ``1h 02m 05s``; ``9`` -> ``9s``."""
    seconds = int(round(max(0.0, float(seconds))))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _last_answer(result):
    if result.get("status"):
        return f"HTTP {result['status']}"
    return (result.get("error") or "no answer yet").split(":")[0]


def progress_line(host, checks, results, elapsed):
    """One line naming what a host still waits for, e.g.

    ``a-d0: waiting for 2 of 4 health URLs after 2m 00s (timeout 30m 00s): pd-a-decode0-dp0 (HTTP 503), ...``
    """
    pending = [(c, r) for c, r in zip(checks, results) if r.get("pending")]
    timeout = max((float(c["timeout_s"]) for c, _item in pending), default=0.0)
    names = ", ".join(f"{c['name']} ({_last_answer(r)})" for c, r in pending)
    return (f"{host}: waiting for {len(pending)} of {len(checks)} health URLs after {duration(elapsed)} "
            f"(timeout {duration(timeout)}): {names}")


def done_line(host, results, elapsed):
    """The closing line of a wait that printed progress: how many answered, after how long."""
    ok = sum(1 for r in results if r.get("ok"))
    return f"{host}: {ok} of {len(results)} health URLs answered after {duration(elapsed)}"


def next_slice(checks, results, elapsed):
    """(indexes, checks) still pending, each check's timeout_s cut to what it has left after ``elapsed``."""
    out = []
    for index, (check, result) in enumerate(zip(checks, results)):
        if result.get("pending"):
            left = float(check["timeout_s"]) - elapsed
            out.append((index, dict(check, timeout_s=max(0.0, left))))
    return [i for i, _check in out], [c for _index, c in out]


def merge(results, indexes, slice_results, elapsed_before):
    """Fold one slice's results into ``results`` (attempts add up; waited_s counts from the task start)."""
    for index, new in zip(indexes, slice_results):
        old = results[index]
        merged = dict(new, attempts=old.get("attempts", 0) + new.get("attempts", 0),
                      waited_s=round(elapsed_before + float(new.get("waited_s", 0.0)), 2))
        if not merged.get("pending"):
            merged.pop("pending", None)
        results[index] = merged
    return results


class ActionModule(ActionBase):
    """Runs the pd_http_wait module slice by slice, printing a progress line between slices."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        progress = args.pop("progress_s", None)
        if progress is None:
            progress = task_vars.get("pd_health_progress_s", DEFAULT_PROGRESS_S)
        try:
            progress = float(progress)
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"pd_http_wait: progress_s: {progress!r} is not a number of seconds "
                                    f"— give e.g. 60, or 0 for no progress lines") from exc
        checks = args.get("checks")
        if isinstance(checks, list) and not checks:
            result.update(changed=False, results=[], all_ok=True)
            return result
        host = task_vars.get("inventory_hostname", "?")
        # the module of the task's own name: pd_http_wait here, pd.deploy.pd_http_wait in the collection
        module = self._task.action or "pd_http_wait"
        start = time.monotonic()
        first = self._execute_module(module, module_args=dict(args, slice_s=max(0.0, progress)),
                                     task_vars=task_vars)
        if first.get("failed") or first.get("skipped") or progress <= 0:
            result.update(first)
            return result
        checks = [dict(c) for c in checks]
        results = list(first.get("results") or [])
        printed = False
        while any(r.get("pending") for r in results):
            elapsed = time.monotonic() - start
            display.display(progress_line(host, checks, results, elapsed))
            printed = True
            indexes, pending = next_slice(checks, results, elapsed)
            # a later slice goes on at the full interval: the short first pauses are for the wait's start
            more = self._execute_module(module, module_args=dict(args, checks=pending, slice_s=progress,
                                                                 first_interval=args.get("interval", 5.0)),
                                        task_vars=task_vars)
            if more.get("failed"):
                result.update(more)
                return result
            merge(results, indexes, more.get("results") or [], elapsed)
        if printed:
            display.display(done_line(host, results, time.monotonic() - start))
        result.update(changed=False, results=results, all_ok=all(r.get("ok") for r in results))
        return result
