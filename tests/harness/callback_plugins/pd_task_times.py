# Test harness only (not part of the collection): each task's wall time, for run-molecule.sh's summary of
# where a scenario spends its time. Enabled by .config/molecule/config.yml (Molecule's playbooks) and by
# molecule/shared/tasks/nested-playbook.yml (the repository's playbooks that a scenario runs as an
# operator would), both through ANSIBLE_CALLBACK_PLUGINS / ANSIBLE_CALLBACKS_ENABLED. Prints nothing:
# a nested run's output, which scenarios assert on, stays as it was.
from __future__ import annotations

DOCUMENTATION = """
name: pd_task_times
type: aggregate
short_description: append each task's wall time to the file named by PD_TASK_TIMES
description:
  - Test harness of pd-deploy (tests/harness/run-molecule.sh). When the environment variable
    PD_TASK_TIMES names a file, one tab-separated line is appended to it for every task that ran,
    when the next task, play or the playbook's end starts - end (epoch seconds), seconds, playbook
    file name, task name (role prefixed), task file and line (relative to the checkout). Without
    PD_TASK_TIMES it does nothing.
requirements:
  - enabled with ANSIBLE_CALLBACKS_ENABLED
"""

import os
import time

from ansible.plugins.callback import CallbackBase

# the checkout: tests/harness/callback_plugins/<this file>
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# the collection's roles and playbooks resolve through this committed symlink to the checkout
_COLLECTION = os.path.join("collections", "ansible_collections", "pd", "deploy") + os.sep


def short_path(path):
    """A task's path:line relative to the checkout (through the collection's symlink too), or to
    site-packages (Molecule's playbooks)."""
    if not path:
        return "-"
    rel = os.path.relpath(path, _REPO) if os.path.isabs(path) else path
    if rel.startswith(".." + os.sep):
        # Molecule's own playbooks (create.yml, ...): from the package on
        return path.rsplit(os.sep + "site-packages" + os.sep, 1)[-1]
    return rel[len(_COLLECTION):] if rel.startswith(_COLLECTION) else rel


def clean(text):
    """One field of a tab-separated line."""
    return " ".join(str(text).split())


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pd_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._out = os.environ.get("PD_TASK_TIMES") or None
        self._playbook = "-"
        self._current = None  # (start, name, path)

    def _close(self):
        if self._current is None or self._out is None:
            self._current = None
            return
        start, name, path = self._current
        self._current = None
        end = time.time()
        line = "%.3f\t%.3f\t%s\t%s\t%s\n" % (end, end - start, self._playbook, name, path)
        try:
            with open(self._out, "a", encoding="utf-8") as out:
                out.write(line)
        except OSError:
            self._out = None  # a harness aid: never fail a run over it

    def v2_playbook_on_start(self, playbook):
        self._playbook = clean(os.path.basename(getattr(playbook, "_file_name", "") or "-"))

    def v2_playbook_on_play_start(self, play):
        self._close()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self._current = (time.time(), clean(task.get_name()), short_path(task.get_path()))

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats):
        self._close()
