# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checks of what reaches Docker and vLLM as strings, before anything is started.

- ``cluster_violations(cluster)``: one normalized cluster: the image reference, paths mounted into
  containers, environment variable names, and the engine settings vLLM itself refuses at start.
- ``owned_violations(cluster)`` (part of the above): ``extra_args``, ``env`` and ``additional_config``
  must not set a flag, a variable or a JSON key the renderer sets (a second ``--port``,
  ``--tokenizer-mode``, ``ASCEND_RT_VISIBLE_DEVICES``, ``recompute_scheduler_enable``): the one table
  plugins/plugin_utils/data/owned_keys.yml names each rendered key's owner, which the message names.
"""

import ipaddress
import re

from ..plan import model
from ..shared import datafiles, text
from .violation import violation

# Docker image reference (distribution/reference grammar: [registry[:port]/]path[:tag][@digest];
# path components lowercase; tag up to 128 word characters, dots and dashes).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
IMAGE_RE = re.compile(
    rf"^(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
# POSIX portable environment variable names (what a shell can export)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: vLLM short options and the long flag each stands for (vLLM EngineArgs.add_cli_args).
SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size", "-dpn": "--data-parallel-rank",
               "-dpa": "--data-parallel-address", "-dpp": "--data-parallel-rpc-port",
               "-pp": "--pipeline-parallel-size", "-ep": "--enable-expert-parallel"}
#: vLLM's other short option of a JSON flag (vllm vllm/engine/arg_utils.py: "--compilation-config", "-cc")
SHORT_FLAGS["-cc"] = "--compilation-config"


def owned_keys():
    """plugins/plugin_utils/data/owned_keys.yml: every rendered flag, env variable and JSON key with its owner."""
    return datafiles.yaml_data("owned_keys.yml")


def _flag_name(arg):
    """The long flag an argv item sets, normalized as vLLM reads it, or None for a value."""
    return _flag_and_path(arg)[0]


def _flag_and_path(arg):
    """(long flag, dotted JSON path or None) of an argv item; (None, None) for a value.

    vLLM reads ``--json-arg.key1.key2 value`` as ``--json-arg '{"key1": {"key2": value}}'`` and
    ``--json-arg.key+ v`` as an item appended to a list (vllm-project/vllm docs/cli/json_tip.inc.md).
    """
    if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--"):
        return None, None
    name = arg.split("=", 1)[0]
    name, _sep, path = name.partition(".")
    path = path.rstrip("+") or None
    if not name.startswith("--"):
        return SHORT_FLAGS.get(name, name), path
    name = "--" + name[2:].replace("_", "-")
    return ("--" + name[5:] if name.startswith("--no-") else name), path


def _json_paths(value, prefix=""):
    """Dotted paths of every leaf of a JSON-like value (list items as ``[]``), parents first."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _json_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            yield from _json_paths(item, prefix + "[]")


def _pass_through_paths(row, given):
    """(path as the operator wrote it, every rendered path it lands at) of a pass-through JSON row."""
    given = given if isinstance(given, dict) else {}
    if not row.get("per_connector"):
        for path in _json_paths(given):
            yield path, f"{row['at']}.{path}" if row.get("at") else path
        return
    for connector, keys in given.items():  # {rendered connector name: keys of its extra config}
        for path in _json_paths(keys if isinstance(keys, dict) else {}):
            for at in (row["at"], row["in_multi"]):
                yield f"{connector}.{path}", f"{at}.{path}"


def _at(mapping, keys):
    """The value at a key path of nested dicts, or None."""
    for key in keys:
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return mapping


def owned_violations(cluster):
    """extra_args, env and additional_config entries that set a key pd-deploy renders, with its owner.

    One table (plugins/plugin_utils/data/owned_keys.yml) says who owns each rendered key; whatever reaches a
    launch spec through a pass-through (engine.extra_args, env, engine.additional_config) may not set
    one of them a second way.
    """
    table = owned_keys()
    argv, env_keys, json_keys = table["engine_argv"], table["engine_env"], table["engine_json"]
    out = []
    name = cluster["name"]
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        where = f"{name}/{role}"

        def owner(text, role=role):
            return text.replace("<role>", role)

        for arg in rcfg["engine"].get("extra_args") or []:
            flag, path = _flag_and_path(arg)
            if flag not in argv:
                continue
            key = owner(json_keys.get(flag, {}).get(path) or argv[flag])
            what = f"{flag}.{path}" if path else flag
            said = text.shown(arg) if arg.split("=", 1)[0] == what else f"{text.shown(arg)} (that is {what})"
            out.append(violation("error", where, f"{role}.engine.extra_args",
                                 f"{said} repeats what pd-deploy renders from {key} (two values: vLLM "
                                 "keeps the last, the checks saw the first)",
                                 f"remove it from {role}.engine.extra_args and set {key} instead"))
        for var in rcfg.get("env") or {}:
            if var in env_keys:
                key = owner(env_keys[var])
                out.append(violation("error", where, f"{role}.env.{text.shown(var)}",
                                     f"{var} is set by pd-deploy for every rank (from {key}); an env entry would "
                                     "silently replace it",
                                     f"remove {role}.env.{var} and set {key} instead"))
        for row in table["pass_through"]["json"]:
            field = row["key"].replace("pd_cluster.<role>.", f"{role}.")
            given = _at(rcfg, field.split(".")[1:])
            owned = json_keys[row["flag"]]
            for path, full in _pass_through_paths(row, given):
                if full not in owned:
                    continue
                key = owner(owned[full])
                out.append(violation("error", where, f"{field}.{text.shown(path)}",
                                     f"sets {full} of {row['flag']}, which pd-deploy renders from {key} (the rules "
                                     "check that key only)",
                                     f"remove it from {field} and set {key} instead"))
    return out


def cluster_violations(cluster):
    """Strings that would reach Docker or vLLM broken, and engine limits vLLM refuses at start."""
    name = cluster["name"]
    out = []
    image = cluster.get("image")
    if not isinstance(image, str) or not IMAGE_RE.match(image):
        out.append(violation("error", name, "image", f"{image!r} is not a Docker image reference (spaces, upper case "
                             "in the repository path, or a bad tag)",
                             "write registry/repository:tag, e.g. quay.io/ascend/vllm-ascend:v0.25.1rc1"))
    path = (cluster.get("model") or {}).get("path")
    if isinstance(path, str) and (":" in path or "," in path):
        out.append(violation("error", name, "model.path", f"{path!r} holds ':' or ',' which Docker reads as the "
                             "separator of a volume's source, target and options",
                             "move or link the model to a directory without ':' and ','"))
    try:
        ipaddress.ip_address(str(cluster.get("bind_host")))
    except ValueError:
        out.append(violation("error", name, "bind_host", f"{cluster.get('bind_host')!r} is not an IP address",
                             "set bind_host to 0.0.0.0 (every interface) or the IP the engines listen on"))
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        where = f"{name}/{role}"
        for key, value in (rcfg.get("env") or {}).items():
            if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                out.append(violation("error", where, f"{role}.env", f"{key!r} is not a valid environment variable name",
                                     "use letters, digits and '_' only, not starting with a digit"))
            elif not isinstance(value, (str, int, float, bool)) or value is None:
                out.append(violation("error", where, f"{role}.env.{key}", f"{value!r} is not a scalar",
                                     "give the variable a string or number value"))
        for arg in rcfg["engine"].get("extra_args") or []:
            if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
                out.append(violation("error", where, f"{role}.engine.extra_args", f"{arg!r} is not a command-line word",
                                     "write each flag and each value as its own string"))
        eng = rcfg["engine"]
        seqs, batched = eng.get("max_num_seqs"), eng.get("max_num_batched_tokens")
        if isinstance(seqs, int) and isinstance(batched, int) and batched < seqs:
            # vLLM SchedulerConfig.verify_max_model_len: max_num_batched_tokens must be >= max_num_seqs
            out.append(violation("error", where, f"{role}.engine.max_num_batched_tokens",
                                 f"{batched} is below max_num_seqs {seqs}: vLLM refuses to start "
                                 "(max_num_batched_tokens must be greater than or equal to max_num_seqs)",
                                 f"set max_num_batched_tokens >= {seqs} (decode: about max_num_seqs x (1 + speculative "
                                 "tokens)) or lower max_num_seqs"))
    return out + owned_violations(cluster)
