"""Checks of what reaches Docker and vLLM as strings, before anything is started.

- ``cluster_violations(cluster)``: one normalized cluster: the image reference, paths mounted into
  containers, environment variable names, and the engine settings vLLM itself refuses at start.
- ``spec_violations(cluster, topo, specs)``: ``extra_args`` and ``env`` must not repeat a flag or a
  variable the renderer sets (a second ``--port``, a second ``--kv-transfer-config``,
  ``ASCEND_RT_VISIBLE_DEVICES``, ``HCCL_IF_IP``): the set is read from a launch spec rendered without
  them, so a flag the renderer learns later is covered without a change here.
"""

import copy
import ipaddress
import re

from pd_deploy import model

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
#: Which pd_cluster key (or host fact) renders a flag; flags not listed map to <role>.engine.<name>.
FLAG_KEYS = {
    "--host": "bind_host", "--port": "{role}.port_base", "--served-model-name": "model.served_name",
    "--data-parallel-size": "{role}.dp", "--data-parallel-rank": "{role}.dp (ranks are placed by the renderer)",
    "--data-parallel-address": "the hosts of {role} (placed by the renderer)",
    "--data-parallel-rpc-port": "{role}.dp_rpc_port", "--tensor-parallel-size": "{role}.tp",
    "--kv-transfer-config": "{role}.offload_connector / cpu_offload / mooncake / kv_port",
    "--additional-config": "{role}.recompute_scheduler",
    "--speculative-config": "{role}.engine.num_speculative_tokens",
}
#: Which key renders an environment variable the renderer owns.
ENV_KEYS = {
    "ASCEND_RT_VISIBLE_DEVICES": "pd_npus / pd_npu_first and {role}.tp (the device layout)",
    "HCCL_IF_IP": "pd_host_address (or ansible_host)",
    "GLOO_SOCKET_IFNAME": "pd_hccl_if", "TP_SOCKET_IFNAME": "pd_hccl_if", "HCCL_SOCKET_IFNAME": "pd_hccl_if",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "{role}.engine.prefix_cache_retention_interval",
}


def _v(level, where, field, message, fix):
    return {"level": level, "where": where, "field": field, "message": message, "fix": fix}


def _flag_name(arg):
    """The long flag an argv item sets, normalized as vLLM reads it, or None for a value."""
    if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return SHORT_FLAGS.get(name, name)
    name = "--" + name[2:].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def cluster_violations(cluster):
    """Strings that would reach Docker or vLLM broken, and engine limits vLLM refuses at start."""
    name = cluster["name"]
    out = []
    image = cluster.get("image")
    if not isinstance(image, str) or not IMAGE_RE.match(image):
        out.append(_v("error", name, "image", f"{image!r} is not a Docker image reference (spaces, upper case "
                      "in the repository path, or a bad tag)",
                      "write registry/repository:tag, e.g. quay.io/ascend/vllm-ascend:v0.25.1rc1"))
    path = (cluster.get("model") or {}).get("path")
    if isinstance(path, str) and (":" in path or "," in path):
        out.append(_v("error", name, "model.path", f"{path!r} holds ':' or ',' which Docker reads as the "
                      "separator of a volume's source, target and options",
                      "move or link the model to a directory without ':' and ','"))
    try:
        ipaddress.ip_address(str(cluster.get("bind_host")))
    except ValueError:
        out.append(_v("error", name, "bind_host", f"{cluster.get('bind_host')!r} is not an IP address",
                      "set bind_host to 0.0.0.0 (every interface) or the IP the engines listen on"))
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        where = f"{name}/{role}"
        for key, value in (rcfg.get("env") or {}).items():
            if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                out.append(_v("error", where, f"{role}.env", f"{key!r} is not a valid environment variable name",
                              "use letters, digits and '_' only, not starting with a digit"))
            elif not isinstance(value, (str, int, float, bool)) or value is None:
                out.append(_v("error", where, f"{role}.env.{key}", f"{value!r} is not a scalar",
                              "give the variable a string or number value"))
        for arg in rcfg["engine"].get("extra_args") or []:
            if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
                out.append(_v("error", where, f"{role}.engine.extra_args", f"{arg!r} is not a command-line word",
                              "write each flag and each value as its own string"))
        eng = rcfg["engine"]
        seqs, batched = eng.get("max_num_seqs"), eng.get("max_num_batched_tokens")
        if isinstance(seqs, int) and isinstance(batched, int) and batched < seqs:
            # vLLM SchedulerConfig.verify_max_model_len: max_num_batched_tokens must be >= max_num_seqs
            out.append(_v("error", where, f"{role}.engine.max_num_batched_tokens",
                          f"{batched} is below max_num_seqs {seqs}: vLLM refuses to start "
                          "(max_num_batched_tokens must be greater than or equal to max_num_seqs)",
                          f"set max_num_batched_tokens >= {seqs} (decode: about max_num_seqs x (1 + speculative "
                          "tokens)) or lower max_num_seqs"))
    return out


def _bare(cluster):
    """A copy of the cluster without operator extra_args and env: what the renderer alone sets."""
    bare = copy.deepcopy(cluster)
    for rcfg in bare["roles"].values():
        rcfg["engine"]["extra_args"] = []
        rcfg["env"] = {}
    return bare


def spec_violations(cluster, topo, specs):
    """extra_args / env that repeat a flag or a variable the renderer sets, with the key to use."""
    out = []
    bare = None
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        extra = [a for a in rcfg["engine"].get("extra_args") or [] if isinstance(a, str)]
        env = rcfg.get("env") or {}
        if not extra and not env:
            continue
        sample = next((s for s in specs if s["role"] == role), None)
        if sample is None:
            continue
        bare = bare or _bare(cluster)
        inst = next(i for i in topo["instances"] if i["role"] == role and i["index"] == sample["instance"])
        rank = next(r for r in inst["ranks"] if r["dp_rank"] == sample["dp_rank"])
        base = model.rank_spec(bare, inst, rank, topo["hosts"][rank["host"]])
        owned_flags = {f for f in map(_flag_name, base["command"]) if f}
        owned_env = set(base["env"]) - set(cluster.get("env_common") or {})
        where = f"{cluster['name']}/{role}"
        for arg in extra:
            flag = _flag_name(arg)
            if flag in owned_flags:
                key = FLAG_KEYS.get(flag)
                if key is None:
                    engine_key = flag[2:].replace("-", "_")
                    key = f"{role}.engine.{engine_key}" if engine_key in rcfg["engine"] else "its pd_cluster key"
                out.append(_v("error", where, f"{role}.engine.extra_args",
                              f"{arg!r} repeats {flag}, which pd-deploy renders (two values: vLLM keeps the "
                              "last, the checks saw the first)",
                              f"remove it from extra_args and set {key.format(role=role)} instead"))
        for name in env:
            if name in owned_env:
                key = ENV_KEYS.get(name, "the inventory key that renders it").format(role=role)
                out.append(_v("error", where, f"{role}.env.{name}",
                              f"{name} is set by pd-deploy for every rank (from {key}); an env entry would "
                              "silently replace it",
                              f"remove {role}.env.{name} and set {key} instead"))
    return out


FILTERS = {}
