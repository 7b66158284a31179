# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A cluster's deploy lock file on a host: read, create (O_EXCL) and give back.

Runs on the target host's Python, standard library only. Used by pd_deploy_lock (take, check, give
back) and by pd_container_logs, which gives back the locks this run holds on its host in the batch's
last module run there instead of a module run of its own (roles/pd_rollout/tasks/scan_logs.yml).
"""

import json
import os


def read_holder(path):
    """The holder recorded in ``path``; None when there is no lock, {} for an unreadable or empty file
    (a run killed mid-write)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def create(path, holder):
    """Create the lock file with O_EXCL; False when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(holder, handle, sort_keys=True)
    return True


def release(path, run_id):
    """Give back the lock at ``path`` when run ``run_id`` holds it: (released, holder found). A lock that
    is gone or held by another run is left as it is."""
    found = read_holder(path)
    if found is not None and found.get("run_id") == run_id:
        os.unlink(path)
        return True, found
    return False, found
