"""Privilege escalation (issue 23 #1; docs/guide/install.md "A deploy user with sudo"): a task that needs
root on a host asks for it (become: true), a task on the controller never sudoes, even under -b
(become: false), and nothing else escalates. molecule/ops runs every playbook it covers as a user with
sudo and a controller without it; this test finds the task a new playbook or role forgot."""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(list(REPO.glob("roles/*/tasks/*.yml")) + list(REPO.glob("roles/*/handlers/*.yml"))
               + list(REPO.glob("playbooks/*.yml")))

#: the keys of a task that are not its module
KEYWORDS = {
    "name", "when", "loop", "loop_control", "register", "vars", "delegate_to", "delegate_facts", "run_once",
    "become", "become_user", "changed_when", "failed_when", "ignore_errors", "ignore_unreachable", "no_log",
    "tags", "notify", "listen", "until", "retries", "delay", "async", "poll", "environment", "args",
    "check_mode", "diff", "throttle", "any_errors_fatal", "block", "rescue", "always", "with_items",
    "with_dict", "timeout", "module_defaults", "collections", "debugger",
}
#: what needs root on a host: the Docker socket (root:docker, 0660; its modules, or any task given the socket, such as a
#: uri call with unix_socket) and the lock file under /var/lib/pd-deploy
ROOT_MODULE_PREFIXES = ("community.docker.",)
#: + the host bootstrap's system changes: packages, the engine's service, and the files under /etc and /var/lib
#: that pd_bootstrap's path variables name (daemon.json, the limits.d file, pd-deploy's directories)
ROOT_MODULES = {"pd.deploy.pd_deploy_lock", "ansible.builtin.apt", "ansible.builtin.systemd_service"}
SYSTEM_PATH_VARS = ("pd_bootstrap_docker_daemon_json", "pd_bootstrap_limits_file", "pd_bootstrap_directories")


def _tasks(items, where):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        if any(key in task for key in ("block", "rescue", "always")):
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key), where)
            continue
        yield where, task


def _all_tasks():
    for path in FILES:
        data = yaml.safe_load(path.read_text()) or []
        rel = str(path.relative_to(REPO))
        if "/tasks/" in rel or "/handlers/" in rel:
            yield from _tasks(data, rel)
            continue
        for play in data:
            if "import_playbook" in play:
                continue
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield from _tasks(play.get(key), rel)


def _module(task):
    keys = [k for k in task if k not in KEYWORDS]
    return keys[0] if keys else None


def _needs_root(task):
    module = _module(task)
    if module is None:
        return False
    args = task.get(module)
    text = yaml.safe_dump(args) if args is not None else ""
    files = {k: args.get(k) for k in ("path", "dest", "src")} if isinstance(args, dict) else {}
    system_paths = any(var in yaml.safe_dump([files, task.get("loop")]) for var in SYSTEM_PATH_VARS)
    return (module.startswith(ROOT_MODULE_PREFIXES) or module in ROOT_MODULES or system_paths
            or "docker_socket" in text or "docker_host" in text or "unix_socket" in text)


def _on_controller(task):
    return task.get("delegate_to") == "localhost"


TASKS = list(_all_tasks())


def test_the_scan_sees_the_tasks():
    # a scan that found nothing would pass every rule below
    assert len(TASKS) > 100
    assert sum(_needs_root(t) for _, t in TASKS) > 20
    assert sum(_on_controller(t) for _, t in TASKS) > 10


@pytest.mark.parametrize("where,task", [(w, t) for w, t in TASKS if _needs_root(t) and not _on_controller(t)],
                         ids=lambda v: v if isinstance(v, str) else v.get("name", "?"))
def test_host_tasks_that_need_root_become(where, task):
    assert task.get("become") is True, (
        f"{where}: task {task.get('name')!r} talks to the Docker socket, the lock dir or system files on a host: "
        "add become: true")


@pytest.mark.parametrize("where,task", [(w, t) for w, t in TASKS if _on_controller(t)],
                         ids=lambda v: v if isinstance(v, str) else v.get("name", "?"))
def test_controller_tasks_never_sudo(where, task):
    assert task.get("become") is False, (
        f"{where}: task {task.get('name')!r} runs on the controller: add become: false (never sudo there, even under -b)")


def test_nothing_else_escalates():
    extra = [f"{w}: {t.get('name')}" for w, t in TASKS if t.get("become") is True and not _needs_root(t)]
    assert not extra, f"become: true on tasks that need no root: {extra}"


def test_no_play_escalates_as_a_whole():
    for path in REPO.glob("playbooks/*.yml"):
        for play in yaml.safe_load(path.read_text()) or []:
            assert "become" not in play, f"{path.name}: play {play.get('name')!r} sets become: set it on the tasks that need root"
