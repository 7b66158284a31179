# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""host_group_vars that names the file and line of a YAML error.

ansible-core 2.19's ``host_group_vars`` (plugins/vars/host_group_vars.py, ``get_vars``) catches every
exception while loading group_vars/ and host_vars/ and raises ``AnsibleParserError(to_native(e))``:
the message keeps "YAML parsing failed: ..." but drops the origin (path, line, column) the YAML loader
attached, so an operator reads neither file nor line. This plugin loads the same files the same way
(it is the built-in plugin) and, on failure, raises an error that starts with ``path:line:column``.
ansible.cfg enables it in place of the built-in one (``vars_plugins_enabled``).
"""

DOCUMENTATION = """
    name: pd_group_vars
    short_description: group_vars/host_vars like the built-in plugin, with file and line in YAML errors
    description:
      - Loads group_vars/ and host_vars/ next to the inventory and the playbook, as host_group_vars does.
      - A file that cannot be parsed fails the run with its path, line and column.
    options:
      stage:
        ini:
          - key: stage
            section: vars_pd_group_vars
        env:
          - name: ANSIBLE_VARS_PLUGIN_STAGE
    extends_documentation_fragment:
      - vars_plugin_staging
"""

from ansible.errors import AnsibleParserError
from ansible.plugins.vars.host_group_vars import VarsModule as _BuiltinVarsModule

# The filter library, imported once here in the controller's main process (vars plugins load there,
# before the strategy forks a worker per task and host). Workers inherit it: the plugin loader finds
# ansible_collections.pd.deploy.plugins.filter.pd in sys.modules (plugins/loader.py,
# _load_module_source). Without this, every worker that templates one pd.deploy.* filter imports the
# library and its core anew (about 0.3 s of CPU each: jsonschema, the data files), which made the
# prechecks tasks of a no-op re-run three times slower once the filters were FQCN (make bench-deploy,
# bench/README.md). A failed import is left to the filter loader, which reports it where a filter is used.
try:
    import ansible_collections.pd.deploy.plugins.filter.pd  # noqa: F401  pylint: disable=unused-import
except ImportError:  # pragma: no cover - a controller without the collection's Python requirements
    pass


def _origin(exc):
    """path:line:column of the first exception in the chain that carries a source origin."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        obj = getattr(exc, "obj", None)
        path = getattr(obj, "path", None)
        if path:
            line, col = getattr(obj, "line_num", None), getattr(obj, "col_num", None)
            where = path + (f":{line}" if line else "") + (f":{col}" if line and col else "")
            return where, getattr(exc, "_original_message", None) or str(exc)
        exc = exc.__cause__ or exc.__context__
    return None, None


class _Undeclared:
    """A class attribute that reads as absent (hasattr is False), hiding one the base class declares."""

    def __get__(self, obj, owner):
        raise AttributeError("REQUIRES_ENABLED")


class VarsModule(_BuiltinVarsModule):
    """The built-in loader; only its error message changes."""

    # The built-in plugin declares REQUIRES_ENABLED; a collection's vars plugin is loaded only when
    # vars_plugins_enabled names it anyway, and ansible-core 2.19 (vars/plugins.py, get_vars_from_path)
    # warns on every run of every playbook while a collection plugin has the attribute at all.
    REQUIRES_ENABLED = _Undeclared()

    def get_vars(self, loader, path, entities, cache=True):
        try:
            return super().get_vars(loader, path, entities, cache=cache)
        except AnsibleParserError as exc:
            where, message = _origin(exc.__cause__ or exc.__context__)
            if where is None:
                raise
            raise AnsibleParserError(
                f"{where}: {message} Fix this group_vars/host_vars file (indentation, quoting) and run again."
            ) from None
