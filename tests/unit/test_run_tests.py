"""tests/harness/run-tests.sh (make test): every step runs, a failed one fails the whole, and says why.

The Makefile's targets are replaced by a fake `make` (MAKE=...) that records the target it was asked
for and fails the targets named in FAIL_TARGETS, so the scheduling is tested without Docker.
"""

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "harness", "run-tests.sh")

FAKE_MAKE = """#!/usr/bin/env bash
target="${@: -1}"
echo "$target" >> "$RAN"
echo "output of $target"
[[ " $FAIL_TARGETS " == *" $target "* ]] && { echo "why $target failed"; exit 2; }
exit 0
"""


def _run(tmp_path, fail="", serial=False):
    make = tmp_path / "make"
    make.write_text(FAKE_MAKE)
    make.chmod(0o755)
    ran = tmp_path / "ran"
    env = dict(os.environ, MAKE=str(make), RAN=str(ran), FAIL_TARGETS=fail,
               PD_TEST_LOGS=str(tmp_path / "logs"), PD_TEST_SERIAL="1" if serial else "0")
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    return proc, sorted(ran.read_text().split())


@pytest.mark.parametrize("serial", [False, True])
def test_every_step_runs_and_all_passing_passes(tmp_path, serial):
    proc, ran = _run(tmp_path, serial=serial)
    assert proc.returncode == 0, proc.stderr
    assert ran == ["lint", "molecule", "unit"]
    for name in ("lint", "unit", "molecule"):
        assert f"[make-test]   {name:<10} passed" in proc.stderr, proc.stderr


@pytest.mark.parametrize("failing", ["lint", "unit", "molecule"])
def test_one_failed_step_fails_make_test_and_the_others_still_run(tmp_path, failing):
    proc, ran = _run(tmp_path, fail=failing)
    assert proc.returncode == 1, proc.stderr
    assert ran == ["lint", "molecule", "unit"]
    assert f"[make-test]   {failing:<10} FAILED" in proc.stderr, proc.stderr
    # a background step's output is shown when it failed (molecule prints to the terminal itself)
    shown = proc.stderr if failing != "molecule" else proc.stdout
    assert f"why {failing} failed" in shown, (proc.stdout, proc.stderr)
    for name in {"lint", "unit", "molecule"} - {failing}:
        assert f"[make-test]   {name:<10} passed" in proc.stderr, proc.stderr


def test_serial_mode_stops_nothing_either(tmp_path):
    proc, ran = _run(tmp_path, fail="lint", serial=True)
    assert proc.returncode == 1
    assert ran == ["lint", "molecule", "unit"]
