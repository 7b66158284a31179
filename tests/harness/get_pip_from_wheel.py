"""Stand-in for get-pip.py, with which ansible-test bootstraps pip into every sanity test venv.

ansible-test (ansible_test/_util/target/setup/requirements.py, bootstrap()) downloads get-pip.py from
ci-files.testing.ansible.com unless ``~/.ansible/test/cache/get_pip_<version>.py`` exists; that host is
out of reach here, PyPI is not. tests/harness/check-artifact.sh copies this file to that cache path,
beside the pip wheel of that version it downloaded from PyPI, in a HOME of its own. Like get-pip.py it
installs pip with pip itself, run from the wheel (``python pip-<v>-py3-none-any.whl/pip install``, which
pip supports), from that wheel only.

ansible-test runs it as get-pip.py: the arguments are pip options and requirements (``pip==24.2``), plus
get-pip.py's own ``--no-setuptools`` / ``--no-wheel`` (a venv made by ``venv`` has neither anyway).
"""

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OWN = ("--no-setuptools", "--no-wheel")


def main():
    wheels = sorted(glob.glob(os.path.join(HERE, "pip-*-py3-none-any.whl")))
    if not wheels:
        sys.exit(f"get-pip stand-in: no pip wheel beside {__file__} (tests/harness/check-artifact.sh puts it there)")
    args = [arg for arg in sys.argv[1:] if arg not in OWN]
    command = [sys.executable, os.path.join(wheels[-1], "pip"), "install", "--no-index", "--find-links", HERE, *args]
    sys.exit(subprocess.call(command))


if __name__ == "__main__":
    main()
