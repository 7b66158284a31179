# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The difference between a launch spec and the container that runs under its name (--check --diff).

A launch spec (plugins/plugin_utils/plan/launch.py) says what a container is started with; Docker's
inspect says what the container under that name was started with. Both are put in the same shape
(``spec_view``, ``running_view``) and written as the same text (``render``), so that Ansible's diff
callback prints, per container a deploy would change, the flags, env, image, mounts and devices that
differ. Values of secrets are never shown: the variables a spec lists in ``secret_env`` (and any
whose name says key, token, secret or password) read as the plan's redaction of their value
(``<redacted: sha256:<12 hex>...>``, the HMAC that plugin_utils/validate/secrets.py computes), so a
changed key shows as a changed digest. Runs on the host (pd_host_probe), hence module_utils.
"""

import hashlib
import hmac
import json
import re

#: plugin_utils/validate/secrets.py: DIGEST_LABEL and redaction(), which a unit test keeps equal to these
DIGEST_LABEL = b"pd-deploy api key v1"
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW)", re.IGNORECASE)
#: Docker's /dev/shm size when none is asked for (64 MiB)
DOCKER_SHM_DEFAULT = 64 * 1024 * 1024
PREVIOUS = "-previous"


def redaction(value):
    """What a plan shows instead of a secret ``value`` (plugin_utils/validate/secrets.py redaction())."""
    digest = hmac.new(DIGEST_LABEL, str(value).encode("utf-8"), hashlib.sha256).hexdigest()
    return f"<redacted: sha256:{digest[:12]}...>"


def _secret(name, spec):
    return name in (spec.get("secret_env") or []) or bool(SECRET_NAME.search(name))


def spec_view(spec):
    """The fields of a launch spec a container is started with (what --diff compares)."""
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    return {
        "image": spec.get("image") or "",
        "command": [str(a) for a in spec.get("command") or []],
        "env": {k: (v if v.startswith("<redacted") or not _secret(k, spec) else redaction(v)) for k, v in env.items()},
        "devices": sorted(str(d) for d in spec.get("devices") or []),
        "volumes": sorted(_bind(str(v)) for v in spec.get("volumes") or []),
        "shm_size_bytes": spec.get("shm_size_bytes") or None,
        "network_mode": spec.get("network_mode") or "default",
        "privileged": bool(spec.get("privileged")),
        "restart_policy": spec.get("restart_policy") or "no",
        "spec_hash": (spec.get("labels") or {}).get("pd.spec-hash", ""),
        "state": "running",
    }


def _bind(text):
    """A bind as the spec writes it: ``src:dst[:ro]`` (Docker's default ``:rw`` left out)."""
    return text[:-3] if text.endswith(":rw") else text


def _env_dict(items):
    out = {}
    for item in items or []:
        name, value = str(item).partition("=")[::2]
        out[name] = value
    return out


def running_view(inspect, image_env=None, spec=None):
    """``spec_view``'s shape for a container from Docker's inspect (``/containers/<name>/json``).

    ``image_env`` (the ``Env`` of the image it runs) is left out of its environment unless the spec sets
    that variable or the container changed its value: Docker merges the image's variables into every
    container's. ``spec`` (the launch spec compared with) names the secrets and the defaults that read as
    unset (no shm size asked for).
    """
    spec = spec or {}
    config = inspect.get("Config") or {}
    host = inspect.get("HostConfig") or {}
    state = inspect.get("State") or {}
    base = _env_dict(image_env)
    wanted = set((spec.get("env") or {}))
    env = {k: v for k, v in _env_dict(config.get("Env")).items() if k in wanted or base.get(k) != v}
    env = {k: (redaction(v) if _secret(k, spec) else v) for k, v in env.items()}
    devices = [f"{d.get('PathOnHost', '')}:{d.get('PathInContainer', '')}"
               + ("" if d.get("CgroupPermissions") in (None, "", "rwm") else f":{d['CgroupPermissions']}")
               for d in host.get("Devices") or []]
    shm = host.get("ShmSize") or None
    if shm == DOCKER_SHM_DEFAULT and not spec.get("shm_size_bytes"):
        shm = None
    status = state.get("Status") or ("running" if state.get("Running") else "")
    if status and status != "running" and state.get("ExitCode") is not None and status in ("exited", "dead"):
        status = f"{status} (exit code {state['ExitCode']})"
    return {
        "image": config.get("Image") or "",
        "command": [str(a) for a in config.get("Cmd") or []],
        "env": env,
        "devices": sorted(devices),
        "volumes": sorted(_bind(str(b)) for b in host.get("Binds") or []),
        "shm_size_bytes": shm,
        "network_mode": host.get("NetworkMode") or "default",
        "privileged": bool(host.get("Privileged")),
        "restart_policy": (host.get("RestartPolicy") or {}).get("Name") or "no",
        "spec_hash": (config.get("Labels") or {}).get("pd.spec-hash", ""),
        "state": status or "unknown",
    }


def render(view):
    """A view as text, one value per line (list items and env variables each on their own), for a diff."""
    if view is None:
        return ""
    lines = [f"image: {view['image']}", "command:"]
    lines += [f"  - {json.dumps(a) if (not a or a != a.strip() or ' ' in a) else a}" for a in view["command"]]
    lines.append("env:")
    lines += [f"  {k}: {v}" for k, v in sorted(view["env"].items())]
    for key in ("devices", "volumes"):
        lines.append(f"{key}:")
        lines += [f"  - {v}" for v in view[key]]
    for key in ("shm_size_bytes", "network_mode", "privileged", "restart_policy", "spec_hash", "state"):
        value = view[key]
        lines.append(f"{key}: {'unset' if value is None else str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"


def container_diff(name, spec, inspect, image_env=None):
    """Ansible's diff dict for one container (``inspect`` None: there is none) against ``spec`` (None: the
    container is removed), or None when both read the same."""
    before = None if inspect is None else running_view(inspect, image_env, spec)
    after = None if spec is None else spec_view(spec)
    text_before, text_after = render(before), render(after)
    if text_before == text_after:
        return None
    where = (spec or {}).get("host") or (((inspect or {}).get("Config") or {}).get("Labels") or {}).get("pd.host") or ""
    on = f" on {where}" if where else ""
    return {
        "before_header": f"{name}{on}: " + ("no container" if before is None else "what runs now"),
        "after_header": f"{name}{on}: " + (
            "removed (its instance is no longer in the inventory)" if after is None else "its launch spec"),
        "before": text_before,
        "after": text_after,
    }


def dropped(specs, containers):
    """Names of the labelled containers of the specs' host and cluster that no spec names (ranks of dropped
    instances), without kept previous containers and baseline engines: plugin_utils/rollout/containers.py
    orphans(), for the host's own specs."""
    if not specs:
        return []
    host, cluster = specs[0].get("host"), specs[0].get("cluster")
    names = {s.get("name") for s in specs}
    return [c["name"] for c in containers
            if c.get("cluster") == cluster and c.get("host") == host and c["name"] not in names
            and not c["name"].endswith(PREVIOUS) and not c.get("baseline")]
