# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the host bootstrap (bootstrap-hosts.yml, role pd_bootstrap) writes: Docker's daemon.json merged with
log rotation, live-restore and the ulimits Mooncake needs, and the limits.d file of the same limits.

Pure functions: the role reads the files, these decide their new content, the role writes it only when
it differs (so a second run changes nothing and the engine is restarted only when daemon.json changed).
What is merged is what the prechecks warn about (hostcheck/compat.py docker_problems): a host bootstrapped
with the defaults draws no Docker warning.
"""

import json

from ..shared.errors import PdError

#: log drivers whose files Docker rotates with log-opts max-size / max-file (compat.py reads the same)
ROTATING = ("json-file", "local")


def _positive_int(value, field):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PdError("pd_docker_daemon_config", field, f"{value!r} is not a whole number >= 1",
                      f"set {field} to a whole number >= 1")
    return value


def daemon_config(text, settings):
    """The new daemon.json text: ``text`` (the file now, None when absent) with pd-deploy's keys merged in.

    ``settings``: log_max_size (e.g. "100m"), log_max_file (int), live_restore (bool), nofile (int). Kept: every
    other key of the file, and its log driver when it is one Docker rotates (json-file, local); another
    driver (journald, syslog, ...) is replaced by json-file, whose files the prechecks read. Set:
    log-opts max-size / max-file, live-restore (a restart of dockerd leaves the containers running),
    default-ulimits memlock unlimited and nofile. Sorted keys, two-space indent, a final newline: the same
    input gives the same bytes, so the file is only rewritten when something changes.
    """
    if not isinstance(settings, dict):
        raise PdError("pd_docker_daemon_config", "settings", f"expected a mapping, got {type(settings).__name__}",
                      "pass {log_max_size, log_max_file, live_restore, nofile}")
    size = settings.get("log_max_size")
    if not isinstance(size, str) or not size.strip() or not size.strip()[0].isdigit():
        raise PdError("pd_docker_daemon_config", "pd_bootstrap_docker_log_max_size", f"{size!r} is not a size",
                      "set it to a size Docker reads, e.g. 100m")
    files = _positive_int(settings.get("log_max_file"), "pd_bootstrap_docker_log_files")
    nofile = _positive_int(settings.get("nofile"), "pd_bootstrap_nofile")
    if text is None or not str(text).strip():
        conf = {}
    else:
        try:
            conf = json.loads(text)
        except ValueError as exc:
            raise PdError("pd_docker_daemon_config", "daemon.json", f"the file on the host is not valid JSON ({exc})",
                          "fix or remove it (Docker refuses to start with it), then run bootstrap-hosts.yml again") \
                from None
        if not isinstance(conf, dict):
            raise PdError("pd_docker_daemon_config", "daemon.json", "the file on the host is not a JSON object",
                          "fix or remove it, then run bootstrap-hosts.yml again")
    conf = dict(conf)
    if conf.get("log-driver", "json-file") not in ROTATING:
        conf["log-driver"] = "json-file"
    conf.setdefault("log-driver", "json-file")
    conf["log-opts"] = dict(conf.get("log-opts") or {}, **{"max-size": size.strip(), "max-file": str(files)})
    conf["live-restore"] = bool(settings.get("live_restore", True))
    ulimits = dict(conf.get("default-ulimits") or {})
    ulimits["memlock"] = {"Name": "memlock", "Soft": -1, "Hard": -1}
    ulimits["nofile"] = {"Name": "nofile", "Soft": nofile, "Hard": nofile}
    conf["default-ulimits"] = ulimits
    return json.dumps(conf, indent=2, sort_keys=True) + "\n"


def limits_conf(nofile):
    """/etc/security/limits.d content: memlock unlimited and ``nofile`` open files, for every user and root
    (pam_limits' ``*`` does not cover root). For processes started outside Docker (a Mooncake master, a
    benchmark on the host); containers take Docker's default-ulimits instead."""
    nofile = _positive_int(nofile, "pd_bootstrap_nofile")
    lines = ["# Written by pd-deploy (bootstrap-hosts.yml): Mooncake and pinned CPU offload lock host memory,",
             "# and an engine opens many files. Containers get Docker's default-ulimits (daemon.json) instead."]
    for who in ("*", "root"):
        for kind in ("soft", "hard"):
            lines.append(f"{who:<6} {kind:<5} memlock unlimited")
        for kind in ("soft", "hard"):
            lines.append(f"{who:<6} {kind:<5} nofile  {nofile}")
    return "\n".join(lines) + "\n"
