# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where pd-deploy writes on the controller: the directory ansible-playbook was started in.

The default output directories (plan.json, launch specs, reports, logs) are ``build/`` under the working
directory, the same from a checkout (``make demo`` runs at its top) and from an installed collection,
which is read-only data: ``'build' | pd.deploy.pd_abspath``. Only Python in the controller process
knows that directory: ``lookup('pipe', 'pwd')`` runs in the playbook's directory and ``$PWD`` is
whatever the parent shell left.
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
    """The path filter of pd-deploy."""

    def filters(self):
        return {"pd_abspath": pd_abspath}
