"""Filters that exist only in the collection (tools/build-collection.py copies this file in).

In the repository, build output goes to <checkout>/build (``playbook_dir ~ '/../build'``). An installed
collection is read-only data, so there the same defaults are rewritten to the directory ansible-playbook
was started in, which only Python in the controller process knows: ``lookup('pipe', 'pwd')`` runs in
the playbook's directory and ``$PWD`` is whatever the parent shell left.
"""

import os


def pd_abspath(path):
    """Absolute form of a path relative to the directory ansible-playbook was started in.

    The collection's default output directories (``pd_plan_build_dir``, ``pd_ops_reports_dir``, ...)
    are ``'build' | pd.deploy.pd_abspath`` and below, that is ``<working directory>/build``.
    An absolute path is returned normalized.
    """
    return os.path.abspath(os.path.expanduser(str(path)))


class FilterModule:
    """Collection-only filters of pd-deploy."""

    def filters(self):
        return {"pd_abspath": pd_abspath}
