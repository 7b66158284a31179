"""Every test imports the checkout as the collection pd.deploy, the way ansible-playbook does.

ansible-core's collection loader is installed before any test module is imported, with the checkout's
collections/ folder (its committed symlink ansible_collections/pd/deploy is the repository root; the
ansible wheel's collections are found on sys.path as in a real run). Tests then import plugins
normally, ``from ansible_collections.pd.deploy.plugins.filter import pd``, and Templar resolves
``pd.deploy.<filter>`` from the same modules. ansible-test's pytest plugin does the same for a
collection's unit tests. No sys.path edits, no file loaders.
"""

import os

from ansible.plugins.loader import init_plugin_loader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

init_plugin_loader([os.path.join(REPO, "collections")])
