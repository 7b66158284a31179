"""Helpers of the render tests: run the real ansible-playbook of this venv (one run per CPU at a time)."""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
PLAYBOOK = os.path.join(BIN, "ansible-playbook")
TIMEOUT_S = 300


@dataclass
class Run:
    """One finished ansible-playbook run: exit code and stdout + stderr together."""

    args: list
    rc: int
    output: str

    def __str__(self):
        return f"ansible-playbook {' '.join(self.args)} -> rc {self.rc}\n{self.output[-6000:]}"


def _env(home):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_HOME": home,
        "ANSIBLE_LOCAL_TEMP": os.path.join(home, "tmp"),
        "PATH": BIN + os.pathsep + env.get("PATH", ""),
    })
    return env


def _run_one(args, env):
    try:
        proc = subprocess.run([PLAYBOOK, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        output = exc.output if isinstance(exc.output, str) else (exc.output or b"").decode(errors="replace")
        return Run(args, -1, output + f"\n[test harness] killed after {TIMEOUT_S} s")
    return Run(args, proc.returncode, proc.stdout)


def run_playbooks(jobs, home):
    """Run ``{key: [args...]}`` from the repository root, one per CPU at a time; return ``{key: Run}``."""
    if not os.path.exists(PLAYBOOK):
        pytest.fail(f"ansible-playbook not found next to {sys.executable}: install requirements-dev.txt")
    env = _env(str(home))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {key: pool.submit(_run_one, args, env) for key, args in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def files_under(path):
    """Every file below ``path`` (relative paths), [] when it does not exist."""
    found = []
    for root, _, names in os.walk(path):
        found.extend(os.path.relpath(os.path.join(root, n), path) for n in names)
    return sorted(found)


def assert_no_traceback(run):
    """No Python traceback, and no filter that crashed instead of reporting (Ansible 2.19 prints a
    crashing filter as "The filter plugin 'name' failed: <exception text>" unless run with -vvv)."""
    assert "Traceback (most recent call last)" not in run.output, str(run)
    flat = re.sub(r"\s+", " ", run.output).replace("''", "'")
    assert not re.search(r"filter plugin '[^']+' failed", flat), str(run)
