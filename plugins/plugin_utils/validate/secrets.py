# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster's API key (``pd_api_key``, usually an Ansible Vault value): known to the plan only as a
redaction, injected in clear only where a container is started or a request is sent.

Upstream facts this module follows:

- vLLM ``--api-key`` / env ``VLLM_API_KEY`` (FrontendArgs.api_key; vllm@v0.27.1
  vllm/entrypoints/serve/utils/server_utils.py AuthenticationMiddleware) answers 401 to requests
  under /v1, /v2, /inference and /cohere without ``Authorization: Bearer <key>``; /health, /metrics
  and /version stay open, so health waits and scrapes need no key.
- the vllm-ascend PD proxy (vllm-ascend@main
  examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py:629 and :813) sends
  ``Authorization: Bearer $OPENAI_API_KEY`` to every prefill and decode backend and checks nothing on
  the requests it receives.

The engines get the key through the environment, not ``--api-key``: argv shows in ``ps`` on the host
and in ``docker inspect``'s Cmd; the environment shows in ``docker inspect`` too (docs/guide/inventory.md "Secrets").

A launch spec carries ``"<redacted: sha256:<12 hex>...>"`` where the key goes and lists the variables
in ``secret_env``; the digest is an HMAC of the key under a fixed label, so the spec hash (and thus the
rollout) changes when the key changes while plan.json, renders and reports never hold the key.
"""

import hashlib
import hmac
import re
from collections.abc import Mapping

from ..shared.errors import PdError
from .violation import error, violation

#: HMAC key of the digest: a fixed label (the digest only has to change with the key and not reveal
#: it; a weak key stays guessable from any digest, so use a long random key).
DIGEST_LABEL = b"pd-deploy api key v1"
#: variable the engines read (vLLM FrontendArgs.api_key env fallback)
ENGINE_ENV = "VLLM_API_KEY"
#: variable the PD proxy reads for the Bearer header it sends its backends
PROXY_ENV = "OPENAI_API_KEY"
#: names an operator must not set through pd_cluster env / extra_args (they would sit in clear in the plan)
KEY_ENV = (ENGINE_ENV, PROXY_ENV)
KEY_FLAGS = ("--api-key",)


def digest(key):
    """Hex HMAC-SHA256 of ``key`` under DIGEST_LABEL (never the key itself)."""
    return hmac.new(DIGEST_LABEL, str(key).encode("utf-8"), hashlib.sha256).hexdigest()


def redaction(key):
    """What plans, renders and reports show instead of ``key``."""
    return f"<redacted: sha256:{digest(key)[:12]}...>"


def key_problem(value):
    """None when ``value`` is usable as a Bearer token, else what is wrong (never echoing the value)."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    if value != value.strip() or any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7f for c in value):
        return "holds spaces, line breaks or control characters, which an HTTP Authorization header cannot carry"
    if not value.isascii():
        return "holds non-ASCII characters, which an HTTP Authorization header cannot carry"
    return None


def host_key_fact(value):
    """The plan's view of a host's ``pd_api_key``: {"redaction"} or {"problem"}; None when unset.

    Called where hostvars are read (plugins/filter/pd.py fleet_input) so the key itself never enters
    the fleet description.
    """
    if value is None or is_fact(value):
        return value
    if not isinstance(value, (str, int, float, bool, list, dict)):
        try:  # a vault value not yet decrypted
            value = str(value)
        except Exception as exc:  # noqa: BLE001 -- reported as a violation, never a traceback
            problem, fix = vault_problem(value, exc)
            return {"fact": "pd_api_key", "problem": problem, "fix": fix}
    problem = key_problem(value)
    return {"fact": "pd_api_key", "problem": problem} if problem else {"fact": "pd_api_key", "redaction": redaction(value)}


#: What Ansible says when it has no vault password at all, and when none of those given decrypts the
#: value (ansible-core 2.19 ansible/parsing/vault/__init__.py, the event of the VaultExceptionMarker
#: an undecryptable !vault value becomes).
VAULT_NO_SECRET = "no vault secrets found"
VAULT_WRONG_SECRET = "decryption failed"


def vault_problem(value, exc=None):
    """(problem, fix) for a ``!vault`` value Ansible could not decrypt: no password given, or a wrong one.

    The reason is Ansible's own message, carried by the value (a VaultExceptionMarker in ansible-core
    2.19: ``_marker_event.msg``, its origin in ``formatted_source_context``); never the value itself.
    """
    event = getattr(value, "_marker_event", None)
    said = str(getattr(event, "msg", None) or exc or "")
    origin = re.search(r"Origin: (\S+)", str(getattr(event, "formatted_source_context", None) or ""))
    at = f" (the !vault value at {origin.group(1)})" if origin else ""
    if VAULT_NO_SECRET in said.lower():
        return (f"cannot be read: no vault password was given{at}",
                "give the vault password: --ask-vault-pass or --vault-password-file <file>")
    if VAULT_WRONG_SECRET in said.lower():
        return (f"cannot be read: the vault password given does not decrypt it{at}",
                "give the password it was encrypted with (--ask-vault-pass, --vault-password-file or --vault-id), "
                f"or encrypt it again with yours: {ENCRYPT}")
    return (f"cannot be read ({' '.join(said.split()) or type(exc).__name__}){at}",
            "check the vault password (--ask-vault-pass or --vault-password-file) and the !vault value")


def is_fact(value):
    """True for what host_key_fact returns (so a fact is never digested twice)."""
    return isinstance(value, Mapping) and value.get("fact") == "pd_api_key"


ENCRYPT = "`ansible-vault encrypt_string --name pd_api_key \"$(openssl rand -hex 32)\"`"
FIX = f"set pd_api_key once in the cluster's group_vars, e.g. from {ENCRYPT} (docs/guide/inventory.md, Secrets)"


def cluster_key(name, hosts):
    """(redaction or None, violations) for a cluster from its host records' ``api_key`` facts."""
    out = []
    seen = {}
    for host in hosts:
        fact = host.get("api_key")
        if fact and fact.get("problem"):
            out.append(error(host["name"], "pd_api_key", f"the key {fact['problem']}", fact.get("fix") or FIX))
            continue
        seen[host["name"]] = fact["redaction"] if fact else None
    if len(set(seen.values())) > 1:
        out.append(error(name, "pd_api_key", "the hosts of this cluster do not share one key ("
                         + ", ".join(f"{h}: {r or 'none'}" for h, r in seen.items()) + ")",
                         "set pd_api_key in group_vars/<cluster>.yml only, not per host"))
    clear = sorted({fact["clear_in"] for fact in (h.get("api_key") for h in hosts)
                    if fact and fact.get("clear_in") and not fact.get("problem")})
    for origin in clear:
        out.append(violation("warning", name, "pd_api_key",
                             f"the API key is written in clear in {origin} (not an !vault value): whoever reads "
                             "the inventory (its git history, backups) can call the cluster",
                             f"replace it with an encrypted value: {FIX}"))
    values = set(seen.values())
    return (values.pop() if len(values) == 1 else None), out


def clear_key_violations(cluster):
    """pd_cluster env / extra_args that would carry a key in clear (into plan.json and every render)."""
    out = []
    for role, rcfg in (cluster.get("roles") or {}).items():
        where = f"{cluster['name']}/{role}"
        for name in (rcfg.get("env") or {}):
            if name in KEY_ENV:
                out.append(error(where, f"{role}.env.{name}", "an API key in pd_cluster env is written in clear to "
                                 "build/<inventory>/plan.json and every render file", f"remove it and {FIX}"))
        for arg in (rcfg.get("engine") or {}).get("extra_args") or []:
            if isinstance(arg, str) and arg.split("=", 1)[0] in KEY_FLAGS:
                out.append(error(where, f"{role}.engine.extra_args", "--api-key on the command line is written in "
                                 "clear to build/<inventory>/plan.json, every render file, `ps` and `docker inspect`",
                                 f"remove it and {FIX}"))
    return out


def protect(spec, key_redaction, spec_hash):
    """Add the key variable (as its redaction) to a launch spec and refresh its spec-hash label.

    Engines get VLLM_API_KEY, the proxy OPENAI_API_KEY; ``secret_env`` names them for the container
    role, which puts the real key there (``pd_secret_env``). No key: the spec is left as it is.
    """
    if not key_redaction:
        return spec
    name = PROXY_ENV if spec.get("kind") == "proxy" else ENGINE_ENV
    spec["env"] = dict(spec.get("env") or {}, **{name: key_redaction})
    spec["secret_env"] = [name]
    spec["labels"] = dict(spec["labels"], **{"pd.spec-hash": spec_hash(spec)})
    return spec


def secret_env(spec, api_key=None):
    """The environment a container is started with: ``spec['env']`` with the real key in ``secret_env``.

    Refuses (PdError, never echoing the key) when the spec wants a key and none is given, or when the
    key given is not the one the plan was made with (its redaction differs).
    """
    where = "pd_secret_env"
    if not isinstance(spec, Mapping):
        raise PdError(where, "spec", f"expected a launch spec, got {type(spec).__name__}",
                      "pass an item of the plan's specs")
    env = dict(spec.get("env") or {})
    names = list(spec.get("secret_env") or [])
    if not names:
        return env
    key = None if api_key is None else str(api_key)
    if not key:
        raise PdError(where, f"{spec.get('name')}: pd_api_key",
                      "the plan gives this container an API key but pd_api_key is not set on this host",
                      "run with the vault password (--ask-vault-pass / --vault-password-file) and the same inventory")
    for name in names:
        if env.get(name) != redaction(key):
            raise PdError(where, f"{spec.get('name')}: env.{name}",
                          "pd_api_key on this host is not the key the plan was made with",
                          "set pd_api_key once per cluster in group_vars, not per host")
        env[name] = key
    return env


def auth_headers(api_key=None):
    """{"Authorization": "Bearer <key>"} when a key is set, else {} (requests to /v1 routes)."""
    key = None if api_key is None else str(api_key)
    return {"Authorization": f"Bearer {key}"} if key else {}
