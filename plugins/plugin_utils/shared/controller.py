# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The base of pd-deploy's controller-only actions (pd_plan_check, pd_prechecks_decide, pd_report): no
connection to the host, no file sent, the same in --check, and one message for a missing argument."""

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    """An action that runs on the controller only; ``PLUGIN`` names it, ``REQUIRED`` its required arguments
    (documented in plugins/modules/<PLUGIN>.py)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    # they change nothing on a host; under --check each says what it would do
    _supports_check_mode = True
    PLUGIN = ""
    REQUIRED = ()

    def _required_args(self):
        """The task's arguments, or the failure naming the first required one missing and where it is documented."""
        args = self._task.args
        for name in self.REQUIRED:
            if name not in args:
                raise AnsibleActionFail(f"{self.PLUGIN}: {name} is required (see plugins/modules/{self.PLUGIN}.py)")
        return args
