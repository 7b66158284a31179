# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action plugin: write many small files on the controller in one task.

Render-only runs and the capacity reports write one JSON file per container of the fleet; a copy
task per file costs a task round-trip each (about 0.3 s), which made rendering 64 hosts several
times slower than pinging them. This writes them all at once, only the files whose content
changed, and reports which.

With ``root`` the directory holds exactly the files of the last run: a manifest
(``<root>/.pd-deploy-files.json``) lists the files this action wrote there and for which ``owner``
(the inventory); a file of the previous manifest that this run does not write (a host or container
no longer in the plan, a render-only file after a validate run) is removed, and folders left empty
by that too. Files the action did not write are never touched.
"""

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

MANIFEST = ".pd-deploy-files.json"
display = Display()


def write_files(files, mode=0o644):
    """Write ``files`` ([{path, content}]); return the paths whose content changed."""
    changed = []
    for entry in files:
        path = entry["path"]
        content = entry["content"]
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == content:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        changed.append(path)
    return changed


def read_manifest(root):
    """(owner, [relative paths]) of ``root``'s manifest; (None, []) when there is none or it is unreadable."""
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as handle:
            data = json.load(handle)
        return data.get("owner"), [p for p in data.get("files", []) if isinstance(p, str)]
    except (OSError, ValueError, AttributeError):
        return None, []


def _relative(root, path):
    rel = os.path.relpath(os.path.abspath(path), root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise ValueError(f"{path} is not under {root}")
    return rel


def sync_files(files, root, owner=None, mode=0o644):
    """Write ``files`` under ``root`` and remove the files of the previous run that are not among them.

    Returns (changed paths, removed paths, previous owner). Only paths listed in the previous
    manifest are removed (files this action wrote), then the folders that removal left empty, up
    to ``root``; a path in the manifest that points outside ``root`` is ignored.
    """
    root = os.path.abspath(root)
    new = [_relative(root, f["path"]) for f in files]
    old_owner, old = read_manifest(root)
    changed = write_files(files, mode)
    keep = set(new)
    removed = []
    for rel in old:
        path = os.path.normpath(os.path.join(root, rel))
        if rel in keep or os.path.isabs(rel) or not path.startswith(root + os.sep):
            continue
        if os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
            removed.append(path)
        parent = os.path.dirname(path)
        while parent.startswith(root + os.sep) and os.path.isdir(parent) and not os.listdir(parent):
            os.rmdir(parent)
            parent = os.path.dirname(parent)
    body = json.dumps({"owner": owner, "files": sorted(keep)}, indent=1) + "\n"
    write_files([{"path": os.path.join(root, MANIFEST), "content": body}], mode)
    return changed, removed, old_owner


def preview_files(files, root, owner=None, mode=0o644):  # noqa: ARG001 (sync_files' signature)
    """What sync_files would do, writing nothing (--check): (paths whose content would change, paths of the
    previous run's files that would be removed, previous owner)."""
    root = os.path.abspath(root)
    keep = {_relative(root, f["path"]) for f in files}
    old_owner, old = read_manifest(root)
    changed = []
    for entry in files:
        try:
            with open(entry["path"], encoding="utf-8") as handle:
                if handle.read() == entry["content"]:
                    continue
        except (FileNotFoundError, NotADirectoryError):
            pass
        changed.append(entry["path"])
    removed = [os.path.normpath(os.path.join(root, rel)) for rel in old
               if rel not in keep and not os.path.isabs(rel)
               and os.path.normpath(os.path.join(root, rel)).startswith(root + os.sep)
               and os.path.isfile(os.path.join(root, rel))]
    return changed, removed, old_owner


class ActionModule(ActionBase):
    """``pd_write_files: {files: [{path, content}], mode: "0644", root: <dir>, owner: <str>}`` — on the controller."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files", "mode", "root", "owner"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        files = self._task.args.get("files")
        if not isinstance(files, list) or not all(
                isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("content"), str)
                for f in files):
            raise AnsibleActionFail("pd_write_files: files: expected a list of {path, content} strings")
        mode = int(str(self._task.args.get("mode", "0644")), 8)
        root = self._task.args.get("root")
        owner = self._task.args.get("owner")
        owner = None if owner is None else str(owner)
        removed, old_owner = [], None
        try:
            if root:
                changed, removed, old_owner = sync_files(files, str(root), owner, mode)
            else:
                changed = write_files(files, mode)
        except ValueError as exc:
            raise AnsibleActionFail(f"pd_write_files: files: {exc} — write under root or leave root unset") from exc
        except OSError as exc:
            raise AnsibleActionFail(f"pd_write_files: {exc.filename}: {exc.strerror} — check the build directory") from exc
        if root and old_owner and owner and old_owner != owner:
            display.warning(f"{root} held the output of inventory {old_owner}; replaced by the output of {owner} "
                            f"(-e pd_plan_build_dir=<dir> keeps both)")
        result.update(changed=bool(changed or removed), written=changed, removed=removed, files=len(files))
        return result
