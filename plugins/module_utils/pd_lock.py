"""A cluster's deploy lock file on a host: read, take (O_EXCL) and give back.

Runs on the target host's Python, standard library only. Used by pd_deploy_lock (take, check, give
back), by pd_host_probe, which takes the lock kept on its host before it reads what runs there (the
rollout's first module run of a batch on that host), and by pd_container_logs, which gives it back in
the batch's last module run there (roles/pd_rollout), instead of module runs of their own.
"""

import json
import os


def lock_path(directory, cluster):
    """The lock file of ``cluster`` under ``directory``; ValueError for a name that is no file name."""
    if not cluster or "/" in cluster or cluster.startswith("."):
        raise ValueError(f"cluster {cluster!r} is not a usable lock file name")
    return os.path.join(directory, f"{cluster}.lock")


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


def take(directory, path, mine, force=False):
    """Take the lock at ``path`` for run ``mine`` (its holder record): {path, acquired, holder (this run's,
    or the other run's that holds it), broken (the holder replaced with ``force``), changed}. A lock this
    run holds already is acquired unchanged. OSError when the directory or file cannot be written."""
    out = {"path": path, "acquired": False, "holder": None, "broken": None, "changed": False}
    found = read_holder(path)
    if found is not None and found.get("run_id") == mine.get("run_id"):
        return {**out, "acquired": True, "holder": found}
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if found is not None and force:
        os.unlink(path)
        out["broken"] = found
    if create(path, mine):
        return {**out, "acquired": True, "holder": mine, "changed": True}
    return {**out, "holder": read_holder(path) or found or {}}
