# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Images from a registry: the pull policy and the registry login of each host (role pd_image).

``pd_image_pull`` says whether the deploy pulls the clusters' images on their hosts before the
prechecks: ``never`` (the default: the image is on the host already, e.g. shipped with
playbooks/images.yml), ``missing`` (pull a reference the host does not hold) or ``always`` (ask the
registry every run; a moved tag is then seen by the prechecks). ``pd_image_registry`` with
``pd_image_registry_username`` / ``pd_image_registry_password`` log the host's Docker engine in first
(docker_login, no_log); the password is meant to be an ``!vault`` value.

The plan carries only what the pull needs to decide: {policy, registry, login} per host, never a
credential. The checks here run in the validate stage, before any host is touched.
"""

import re

from .violation import error, violation

POLICIES = ("never", "missing", "always")
#: the role's defaults (roles/pd_image/defaults/main.yml), read here without reading roles/
DEFAULT_POLICY = "never"
FIELDS = ("pd_image_pull", "pd_image_registry", "pd_image_registry_username", "pd_image_registry_password")
_HOSTPORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")
ENCRYPT = "`ansible-vault encrypt_string --name pd_image_registry_password '<password>'`"


def password_fact(value, origin=None):
    """The plan's view of ``pd_image_registry_password``: {"set": bool, "clear_in"?, "problem"?}; never the value.

    ``origin`` is plugins/filter/pd.py's _origin() of the value (None: given with -e, or unknown).
    """
    if value is None:
        return {"set": False}
    if not isinstance(value, (str, int, float, bool, list, dict)):
        try:  # a vault value not yet decrypted
            value = str(value)
        except Exception as exc:  # noqa: BLE001 -- reported as a violation, never a traceback
            from .secrets import vault_problem
            problem, fix = vault_problem(value, exc)
            return {"set": True, "problem": problem, "fix": fix}
    if not isinstance(value, str):
        return {"set": True, "problem": f"is a {type(value).__name__}, not a string"}
    fact = {"set": value != ""}
    if fact["set"] and origin and not origin.get("vaulted") and not origin.get("template"):
        fact["clear_in"] = origin.get("file") or "the inventory"
    return fact


def pull_settings(name, hv):
    """({policy, registry, login}, violations) of host ``name`` from its variables ``hv``.

    ``hv["pd_image_registry_password"]`` is the fact of password_fact(), not the password. A host whose
    settings are refused gets the policy ``never`` in the plan (the violations stop the run anyway).
    """
    out = []
    policy = hv.get("pd_image_pull", DEFAULT_POLICY)
    if policy is None:
        policy = DEFAULT_POLICY
    if policy not in POLICIES:
        out.append(error(name, "pd_image_pull", f"{policy!r} is not a pull policy",
                         f"set pd_image_pull to one of: {', '.join(POLICIES)} (docs/guide/pull.md)"))
        policy = DEFAULT_POLICY
    registry = hv.get("pd_image_registry") or ""
    user = hv.get("pd_image_registry_username") or ""
    password = hv.get("pd_image_registry_password") or {"set": False}
    if not isinstance(registry, str) or (registry and not _HOSTPORT.match(_strip_scheme(registry))):
        out.append(error(name, "pd_image_registry", f"{registry!r} is not a registry host",
                         "set pd_image_registry to the registry's host[:port] as image references name it "
                         "(e.g. harbor.example.com or 10.0.0.5:5000), without a path"))
        registry = ""
    if not isinstance(user, str):
        out.append(error(name, "pd_image_registry_username", f"is a {type(user).__name__}, not a string",
                         "quote the user name in the inventory"))
        user = ""
    if password.get("problem"):
        out.append(error(name, "pd_image_registry_password", f"the password {password['problem']}",
                         password.get("fix") or f"set it from {ENCRYPT} in the cluster's group_vars"))
    if (user or password.get("set")) and not registry:
        given = " and ".join(f for f, v in (("pd_image_registry_username", user),
                                            ("pd_image_registry_password", password.get("set"))) if v)
        out.append(error(name, "pd_image_registry", f"{given} set but no registry to log in to",
                         "set pd_image_registry: <host[:port]> beside the credentials (or remove them)"))
    elif registry and bool(user) != bool(password.get("set")):
        missing = "pd_image_registry_password" if user else "pd_image_registry_username"
        out.append(error(name, missing, f"missing: pd_image_registry {registry} has only one of user name and password",
                         f"set {missing} too (the password as an !vault value: {ENCRYPT}), or neither for an "
                         "anonymous registry"))
    if password.get("clear_in"):
        out.append(violation("warning", name, "pd_image_registry_password",
                             f"the registry password is written in clear in {password['clear_in']} (not an !vault "
                             "value): whoever reads the inventory (its git history, backups) can pull and push",
                             f"replace it with an encrypted value: {ENCRYPT}"))
    login = bool(registry and user and password.get("set") and not password.get("problem"))
    return {"policy": policy, "registry": _strip_scheme(registry) if isinstance(registry, str) else "",
            "login": login}, out


def _strip_scheme(registry):
    return re.sub(r"^https?://", "", registry).rstrip("/") if isinstance(registry, str) else registry


def image_violations(host, settings, images):
    """Images of a host that its pull policy cannot pull: an image ID (``sha256:...``) names no repository."""
    if not settings or settings.get("policy", DEFAULT_POLICY) == "never":
        return []
    out = []
    for image in images:
        if isinstance(image, str) and (image.startswith("sha256:") or re.fullmatch(r"[0-9a-f]{64}", image)):
            out.append(error(host, "pd_image_pull", f"pull policy {settings['policy']} but the cluster's image is an "
                             f"image ID ({image[:19]}...), which no registry serves",
                             "pin the image by its repo digest (<repository>@sha256:...) instead, or set "
                             "pd_image_pull: never for this cluster"))
    return out


def pull_hosts(plan):
    """Names of the plan's hosts whose pull policy is not ``never`` (the hosts of deploy's pull play)."""
    hosts = (plan or {}).get("hosts") or {}
    return [name for name, rec in hosts.items()
            if ((rec or {}).get("image_pull") or {}).get("policy", DEFAULT_POLICY) != "never"]


def pulled_images(results):
    """{ref: {id, repo_digests}} of docker_image_pull loop results (``item`` = the reference, ``image`` = the
    image it names after the pull); a reference without an image (--check, nothing pulled) is left out."""
    out = {}
    for result in results or []:
        if not isinstance(result, dict):
            continue
        image = result.get("image") or {}
        ref = result.get("item")
        if isinstance(ref, str) and isinstance(image, dict) and image.get("Id"):
            out[ref] = {"id": image["Id"], "repo_digests": list(image.get("RepoDigests") or [])}
    return out


def pull_lines(results, host):
    """One progress line per reference of docker_image_pull loop results: what was pulled, what was there."""
    lines = []
    for result in results or []:
        if not isinstance(result, dict):
            continue
        ref = result.get("item")
        image = result.get("image") or {}
        digests = [d for d in image.get("RepoDigests") or [] if isinstance(d, str)] if isinstance(image, dict) else []
        ident = (digests[0].split("@", 1)[1] if digests else image.get("Id")) if isinstance(image, dict) else None
        if result.get("changed"):
            what = "would be pulled (--check)" if not ident else f"pulled: {ident}"
        else:
            what = f"already here: {ident}" if ident else "not pulled"
        lines.append(f"{host}: {ref} {what}")
    return lines
