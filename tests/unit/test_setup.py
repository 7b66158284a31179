"""Set-up says what it needs (issue 23 #8): the Makefile refuses a Python older than 3.11 before it
creates a venv or runs pip, the README names the version, and the changelog is antsibull-changelog's."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _fake_python(tmp_path, version):
    """An interpreter that says it is Python <version> and logs every other call (a venv, a pip)."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "python-fake"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then echo {version}; exit 0; fi\n'
        f'echo "$*" >> "{log}"\n'
        "exit 0\n")
    fake.chmod(0o755)
    return fake, log


def _make(tmp_path, *args):
    env = dict(os.environ, MAKEFLAGS="")
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


@pytest.mark.parametrize("version", ["3.9", "3.10", "2.7"])
def test_old_python_refused_before_any_venv_or_pip(tmp_path, version):
    fake, log = _fake_python(tmp_path, version)
    venv = tmp_path / "venv"
    out = _make(tmp_path, "demo", f"PYTHON={fake}", f"VENV={venv}")
    assert out.returncode != 0
    assert f"is Python {version}; pd-deploy needs Python >= 3.11" in out.stderr
    assert "make demo PYTHON=python3.11" in out.stderr
    # nothing after the check ran: no `python -m venv`, no pip
    assert not venv.exists()
    assert not log.exists()


def test_missing_python_named(tmp_path):
    out = _make(tmp_path, "venv", f"PYTHON={tmp_path / 'no-such-python'}", f"VENV={tmp_path / 'venv'}")
    assert out.returncode != 0
    assert "does not run. pd-deploy needs Python >= 3.11" in out.stderr


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_supported_python_passes_the_check(tmp_path, version):
    fake, _ = _fake_python(tmp_path, version)
    out = _make(tmp_path, "python-check", f"PYTHON={fake}", f"VENV={tmp_path / 'venv'}")
    assert out.returncode == 0, out.stderr
    assert f"is Python {version} (>= 3.11)" in out.stdout


def test_this_python_passes_the_check(tmp_path):
    out = _make(tmp_path, "python-check", f"PYTHON={sys.executable}", f"VENV={tmp_path / 'venv'}")
    assert out.returncode == 0, out.stderr


def test_readme_names_the_python_it_needs():
    assert "Python >= 3.11" in (REPO / "README.md").read_text()


def test_changelog_is_antsibull_changelogs():
    config = yaml.safe_load((REPO / "changelogs/config.yaml").read_text())
    assert config["output"] == [{"file": "CHANGELOG.md", "format": "md"}]
    changes = yaml.safe_load((REPO / "changelogs/changelog.yaml").read_text())
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    # the version galaxy.yml builds is a release of the changelog, or the next one (fragments pending)
    released = set(changes["releases"])
    fragments = list((REPO / "changelogs/fragments").glob("*.yml"))
    assert galaxy["version"] in released or fragments
    text = (REPO / "CHANGELOG.md").read_text()
    for version in released:
        assert f"v{version}".replace(".", "\\.") in text, f"CHANGELOG.md is stale: run antsibull-changelog generate ({version})"
    pins = (REPO / "requirements-dev.txt").read_text().splitlines()
    assert any(line.startswith("antsibull-changelog==") for line in pins)


def test_the_version_is_written_where_the_artifact_is_named():
    """galaxy.yml's version names the tarball the execution environment installs and the install page
    shows: a release that bumps one and not the others ships an EE that cannot build."""
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    tarball = f"pd-deploy-{version}.tar.gz"
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert f"collections/{tarball}" in yaml.safe_dump(ee), f"execution-environment.yml: install {tarball}"
    install = (REPO / "docs/guide/install.md").read_text()
    assert tarball in install and f"pd-deploy-ee:{version}" in install, f"docs/guide/install.md: name {tarball}"


def _fake_venv_python(tmp_path, pip_rc):
    """Python 3.11 whose `-m venv DIR` makes a pip that prints pip's kinds of lines and exits with pip_rc."""
    fake = tmp_path / "python-fake"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then echo 3.11; exit 0; fi\n'
        'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin"; cat > "$3/bin/pip" <<PIP\n'
        "#!/bin/sh\n"
        "echo 'Collecting ansible==12.3.0'\n"
        "echo '  Downloading ansible-12.3.0-py3-none-any.whl (51.6 MB)'\n"
        "echo 'Installing collected packages: ansible'\n"
        f"exit {pip_rc}\n"
        "PIP\n"
        'chmod +x "$3/bin/pip"; exit 0; fi\n'
        "exit 1\n")
    fake.chmod(0o755)
    return fake


def test_first_venv_says_what_it_does_and_shows_pips_progress(tmp_path):
    venv = tmp_path / "venv"
    out = _make(tmp_path, "venv", f"PYTHON={_fake_venv_python(tmp_path, 0)}", f"VENV={venv}")
    assert out.returncode == 0, out.stderr
    assert "installing requirements-dev.txt" in out.stdout and "2 to 3 minutes" in out.stdout
    assert "Collecting ansible==12.3.0" in out.stdout
    assert "Installing collected packages: ansible" in out.stdout
    assert "Downloading" not in out.stdout  # one line per package, not per download
    assert (venv / ".installed").exists()


def test_a_failed_pip_fails_make_and_leaves_no_stamp(tmp_path):
    venv = tmp_path / "venv"
    out = _make(tmp_path, "venv", f"PYTHON={_fake_venv_python(tmp_path, 1)}", f"VENV={venv}")
    assert out.returncode != 0
    assert not (venv / ".installed").exists()
