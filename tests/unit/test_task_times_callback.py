"""tests/harness/callback_plugins/pd_task_times.py: each task's wall time for run-molecule.sh's summary.

A real ansible-playbook run with the callback enabled (a few seconds, no hosts but localhost).
"""

import os
import subprocess
import sys

import pytest

from tests.harness.callback_plugins import pd_task_times

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(REPO, "tests", "harness", "callback_plugins")

PLAYBOOK = """
- name: First
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Sleep a little
      ansible.builtin.command: sleep 0.3
      changed_when: false
    - name: Twice
      ansible.builtin.include_tasks: inner.yml
      loop: [1, 2]
- name: Second
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Last
      ansible.builtin.debug:
        msg: done
"""
INNER = """
- name: Inner
  ansible.builtin.command: sleep 0.2
  changed_when: false
"""


def _run(tmp_path, times):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "inner.yml").write_text(INNER)
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=PLUGINS, ANSIBLE_CALLBACKS_ENABLED="pd_task_times",
               ANSIBLE_NOCOLOR="1")
    env.pop("PD_TASK_TIMES", None)
    if times:
        env["PD_TASK_TIMES"] = str(times)
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([ansible_playbook, "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=" + sys.executable, "play.yml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The playbook run without PD_TASK_TIMES, then with it: (plain output, output, times file)."""
    tmp_path = tmp_path_factory.mktemp("task_times")
    plain = _run(tmp_path, None)
    written_without = sorted(p.name for p in tmp_path.iterdir())
    times = tmp_path / "times.tsv"
    return plain, written_without, _run(tmp_path, times), times, tmp_path


def test_one_line_per_task_run_in_order_with_its_time(runs):
    _, _, _, times, tmp_path = runs
    rows = [line.split("\t") for line in times.read_text().splitlines()]
    assert [(r[2], r[3]) for r in rows] == [("play.yml", "Sleep a little"), ("play.yml", "Twice"),
                                            ("play.yml", "Inner"), ("play.yml", "Inner"), ("play.yml", "Last")]
    assert rows[0][4] == str(tmp_path / "play.yml") + ":6"  # outside the checkout: the full path
    assert rows[2][4].endswith("inner.yml:2")
    ends = [float(r[0]) for r in rows]
    assert ends == sorted(ends)
    assert float(rows[0][1]) >= 0.3 and float(rows[2][1]) >= 0.2 and float(rows[3][1]) >= 0.2
    # each task's time runs to the next one's start: the times add up to the first start to the last end
    assert abs(sum(float(r[1]) for r in rows) - (ends[-1] - (ends[0] - float(rows[0][1])))) < 0.5


def test_without_pd_task_times_nothing_is_written_and_the_output_is_ansible_s_own(runs):
    plain, written_without, with_times, times, _ = runs
    assert "Sleep a little" in plain
    assert written_without == ["inner.yml", "play.yml"]
    # the callback prints nothing: the output a scenario asserts on (a nested run's) is unchanged
    strip = lambda text: [line for line in text.splitlines() if "ok=" not in line]  # noqa: E731
    assert len(strip(with_times)) == len(strip(plain))
    assert times.read_text()


def test_paths_inside_the_checkout_are_relative_and_the_collection_symlink_is_dropped():
    collection = os.path.join(REPO, "collections", "ansible_collections", "pd", "deploy")
    assert pd_task_times.short_path(os.path.join(collection, "roles", "pd_engine", "tasks", "main.yml") + ":7") \
        == os.path.join("roles", "pd_engine", "tasks", "main.yml") + ":7"
    assert pd_task_times.short_path(os.path.join(REPO, "molecule", "x", "verify.yml") + ":3") \
        == os.path.join("molecule", "x", "verify.yml") + ":3"
    assert pd_task_times.short_path("/elsewhere/play.yml:1") == "/elsewhere/play.yml:1"
    assert pd_task_times.short_path("/v/lib/python3.11/site-packages/molecule_plugins/docker/playbooks/create.yml:9") \
        == "molecule_plugins/docker/playbooks/create.yml:9"
    assert pd_task_times.short_path(None) == "-"
