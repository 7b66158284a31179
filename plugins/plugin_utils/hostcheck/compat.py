# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compatibility prechecks: the image, the host driver and Docker's settings against the version row.

Read without starting an engine. vllm-ascend's Dockerfile records no LABEL and no ENV with versions
(vllm-project/vllm-ascend v0.23.0 / v0.25.1rc1 / main:Dockerfile: ``ARG VLLM_TAG``, ``ARG MOONCAKE_TAG``
only), but a build records the build arguments a RUN step used in that step's history entry
(``RUN |3 VLLM_REPO=... VLLM_TAG=v0.25.1 VLLM_COMMIT= /bin/sh -c ...``), which the Engine API's
``GET /images/{name}/history`` returns as ``CreatedBy``. So the vLLM and Mooncake versions come from
the image's history (falling back to env/labels of the image config when a site's own build sets them);
the vllm-ascend version itself is the image tag the row names (its package version is computed from git
at build time and recorded nowhere in the image's metadata).

The host driver is read from /usr/local/Ascend/driver/version.info (``Version=``); Docker's log rotation
and memlock limit from /etc/docker/daemon.json (``log-opts.max-size``, ``default-ulimits.memlock``).
"""

import json
import re

from ..plan import versions
from ..shared.errors import PdError

_ARG = r"(?:^|\s){name}=v?([0-9][0-9A-Za-z.+-]*)"
_VERSION = re.compile(r"^\s*Version\s*=\s*(\S+)\s*$", re.M)
_ROTATING = ("json-file", "local")


def image_versions(image):
    """``{vllm, mooncake}`` of one image from the probe's ``{history, env, labels}`` (None when not recorded)."""
    image = image or {}
    texts = list(image.get("history") or []) + list(image.get("env") or [])
    labels = image.get("labels") or {}
    texts += [f"{k}={v}" for k, v in labels.items()]
    out = {}
    for key, names in (("vllm", ("VLLM_TAG", "VLLM_VERSION")), ("mooncake", ("MOONCAKE_TAG", "MOONCAKE_VERSION"))):
        found = None
        for name in names:
            rx = re.compile(_ARG.format(name=name))
            for text in texts:
                match = rx.search(text or "")
                if match:
                    found = match.group(1)
        out[key] = found
    return out


def driver_version(text):
    """``Version=`` of the driver's version.info, or None."""
    match = _VERSION.search(text or "")
    return match.group(1) if match else None


def _same(found, want):
    return str(found).lstrip("v") == str(want).lstrip("v")


def docker_problems(daemon_json):
    """Log rotation and memlock of Docker's /etc/docker/daemon.json text (None: the file is absent)."""
    fix_log = ('set "log-opts": {"max-size": "100m", "max-file": "5"} in /etc/docker/daemon.json and restart Docker '
               "(engine logs grow without bound otherwise and fill the disk)")
    fix_mem = ('set "default-ulimits": {"memlock": {"Name": "memlock", "Soft": -1, "Hard": -1}} in '
               "/etc/docker/daemon.json and restart Docker (pinned CPU offload and RDMA registration lock host memory)")
    if daemon_json is None:
        return [f"Docker has no /etc/docker/daemon.json: its logs are not rotated — {fix_log}",
                f"Docker has no /etc/docker/daemon.json: containers get the default memlock limit — {fix_mem}"]
    try:
        conf = json.loads(daemon_json or "{}")
    except ValueError as exc:
        return [f"/etc/docker/daemon.json is not valid JSON ({exc}) — fix it; Docker refuses to start with it"]
    if not isinstance(conf, dict):
        return ["/etc/docker/daemon.json is not a JSON object — fix it"]
    out = []
    driver = conf.get("log-driver", "json-file")
    if driver in _ROTATING and not (conf.get("log-opts") or {}).get("max-size"):
        out.append(f"Docker's {driver} log driver has no log-opts max-size: logs are not rotated — {fix_log}")
    memlock = ((conf.get("default-ulimits") or {}).get("memlock") or {})
    if memlock.get("Soft") != -1 or memlock.get("Hard") != -1:
        now = f"Soft {memlock.get('Soft')} / Hard {memlock.get('Hard')}" if memlock else "not set"
        out.append(f"Docker's default memlock ulimit is {now}, not unlimited — {fix_mem}")
    return out


def problems(facts):
    """Compatibility problems of one host, each ``host: what — fix``.

    ``facts``: host, vllm_ascend_version (the cluster's), compat (the probe's ``compat`` result:
    images {ref: {history, env, labels}}, driver_info text or null, daemon_json text or null),
    supported_drivers (optional list of driver versions; when absent the driver is only read).
    """
    host = facts.get("host")
    compat = facts.get("compat")
    if compat is None:
        return []
    if not isinstance(compat, dict):
        raise PdError("pd_compat_problems", "compat", f"is {type(compat).__name__}, not the probe's compat mapping")
    row = versions.version_row(facts["vllm_ascend_version"])
    out = []
    for ref, image in sorted((compat.get("images") or {}).items()):
        found = image_versions(image)
        for key, column in (("vllm", "vllm_version"), ("mooncake", "mooncake_version")):
            want = row.get(column)
            if want and found[key] and not _same(found[key], want):
                out.append(f"image {ref} was built with {key} {found[key]} but the version row {row['line']} "
                           f"(vllm_ascend_version {facts['vllm_ascend_version']}) needs {want} — use the image of "
                           f"that row ({row.get('image_tag')}) or set the cluster's vllm_ascend_version to the "
                           "image's release")
    if compat.get("driver_info") is None:
        out.append("/usr/local/Ascend/driver/version.info is missing — install the Ascend driver (the engine "
                   "containers mount this file)")
    else:
        version = driver_version(compat["driver_info"])
        supported = facts.get("supported_drivers") or []
        if version is None:
            out.append("/usr/local/Ascend/driver/version.info has no Version= line — reinstall the Ascend driver")
        elif supported and not any(version.startswith(s) for s in supported):
            out.append(f"Ascend driver {version} is not one the version row {row['line']} supports "
                       f"({', '.join(supported)}) — upgrade the driver/firmware (Ascend HDK) named in "
                       "vllm-ascend's installation guide for that release")
    return [f"{host}: {p}" for p in out]


def docker_warnings(host, compat):
    """Docker log rotation / memlock findings of one host (warnings: the containers' own settings may cover them)."""
    if not isinstance(compat, dict) or "daemon_json" not in compat:
        return []
    return [f"{host}: {p}" for p in docker_problems(compat.get("daemon_json"))]
