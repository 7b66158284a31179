# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The base of pd-deploy's controller-only actions (pd_plan_make, pd_plan_check, pd_prechecks_decide,
pd_report): no connection to the host, no file sent, the same in --check, and one message for a missing
argument; and the role argument check that an action does in its own task (``role_options``)."""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase


def checked_options(options, values):
    """(errors, values) of ``values`` ({variable: value}) against a role entry point's ``options``: the errors
    as the argument check Ansible prepends to a role reports them ([] when they pass), the values converted
    to the spec's types (a path expanded, a bool a bool)."""
    checked = ArgumentSpecValidator(options).validate(values, validate_role_argument_spec=True)
    return list(checked.error_messages), checked.validated_parameters


def role_options(action, plugin, entry, task_vars):
    """(errors, values): the variables of ``action``'s task's role, entry point ``entry``, checked as Ansible's
    role argument check does (a role included with ``rolespec_validate: false`` then needs no check task),
    and their values, templated and converted to the spec's types (a path expanded, a bool a bool)."""
    role = getattr(action._task, "_role", None)  # noqa: SLF001 -- the task's role, as Ansible's own check reads it
    specs = role._get_role_argspecs() if role is not None else {}  # noqa: SLF001
    spec = (specs.get(entry) or {}).get("options") if isinstance(specs, dict) else None
    if not spec:
        raise AnsibleActionFail(f"{plugin}: check_role_options: {entry!r} is no entry point with options "
                                "in the meta/argument_specs.yml of the task's role — name one, or leave it out")
    return checked_options(spec, action._templar.template({name: task_vars[name] for name in spec if name in task_vars}))  # noqa: SLF001


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
