"""capacity_report.yml and monitoring.yml are controller work: computed once, written once.

A 24-host fleet took 22 s for capacity-report against 3 s for validate: a set_fact, stat, file and
three copy tasks looped over the clusters, each copy a module run on the controller (about 0.7 s).
Now every report is one filter call and every file one pd_write_files run (no module), whatever the
fleet size. The timing itself is in bench/README.md; this checks the shape that makes it fast.
"""

import os

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: modules that each cost a worker + module run per call (per loop item)
MODULE_RUNS = {"copy", "file", "stat", "template", "ansible.builtin.copy", "ansible.builtin.file",
               "ansible.builtin.stat", "ansible.builtin.template"}


def _tasks(playbook):
    with open(os.path.join(REPO, "playbooks", playbook), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    return [t for play in plays for t in play.get("tasks", [])]


@pytest.mark.parametrize("playbook", ["capacity_report.yml", "monitoring.yml"])
def test_controller_playbook_runs_no_module_and_no_loop(playbook):
    tasks = _tasks(playbook)
    assert tasks
    for task in tasks:
        assert not MODULE_RUNS.intersection(task), f"{playbook}: {task['name']}: a module run on the controller"
        assert not {"loop", "with_items", "with_dict"}.intersection(task), f"{playbook}: {task['name']}: a loop"
        assert task.get("run_once") is True, f"{playbook}: {task['name']}: runs per host"
