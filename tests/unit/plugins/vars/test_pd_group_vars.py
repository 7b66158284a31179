"""The vars plugin: the controller imports the filter library once, before any worker is forked."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

# A fresh interpreter (this test process has imported the filters already, through tests/conftest.py):
# load the vars plugin the way ansible-core does and say whether the filter library came with it.
_PROBE = """
import sys
from ansible.plugins.loader import init_plugin_loader, vars_loader
init_plugin_loader([sys.argv[1]])
name = 'ansible_collections.pd.deploy.plugins.filter.pd'
before = name in sys.modules
plugin = vars_loader.get('pd.deploy.pd_group_vars')
print(plugin is not None, before, name in sys.modules)
"""


def test_loading_the_vars_plugin_imports_the_filter_library_in_the_controller():
    # Workers forked per task and host inherit what the main process imported; without this import each
    # worker that used a pd.deploy.* filter imported the library anew (no-op re-run 2.3x -> 3.9x the ping floor)
    out = subprocess.run([sys.executable, "-c", _PROBE, os.path.join(REPO, "collections")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "True"], out
