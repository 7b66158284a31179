# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Launch specs: what each engine rank and the proxy are started with (docs/design.md "Launch spec").

``rank_spec`` renders one engine rank of a normalized cluster and its topology (``model``): image,
argv with the vLLM flags and connector configs, env, devices, mounts, shm, labels; ``proxy_spec``
the cluster's proxy. ``spec_hash`` is what a container is compared by on the next deploy.
"""

import hashlib
import json

from ..shared.errors import PdError
from . import connectors, ports, versions
from .model import ASCEND_CONTROL_DEVICES, ASCEND_MOUNTS, ROLES, host_npus, offload_bytes, shm_bytes


def _flag_args(engine, recipe):
    """vLLM flags of one role's engine keys and the cluster's resolved recipe (docs/design.md)."""
    args = [
        "--max-model-len", str(engine["max_model_len"]),
        "--max-num-seqs", str(engine["max_num_seqs"]),
        "--max-num-batched-tokens", str(engine["max_num_batched_tokens"]),
        "--gpu-memory-utilization", str(engine["gpu_memory_utilization"]),
        "--block-size", str(engine["block_size"]),
        "--enable-prefix-caching" if engine["enable_prefix_caching"] else "--no-enable-prefix-caching",
        "--disable-hybrid-kv-cache-manager" if engine["disable_hybrid_kv_cache_manager"]
        else "--no-disable-hybrid-kv-cache-manager",
    ]
    if engine["max_num_partial_prefills"] != 1:
        args += ["--max-num-partial-prefills", str(engine["max_num_partial_prefills"]),
                 "--max-long-partial-prefills", str(engine["max_long_partial_prefills"]),
                 "--long-prefill-token-threshold", str(engine["long_prefill_token_threshold"])]
    if engine["enforce_eager"]:
        args.append("--enforce-eager")
    if engine["trust_remote_code"]:
        args.append("--trust-remote-code")
    if recipe["enable_expert_parallel"]:
        args.append("--enable-expert-parallel")
    if recipe["quantization"]:
        args += ["--quantization", recipe["quantization"]]
    if recipe["tokenizer_mode"]:
        args += ["--tokenizer-mode", recipe["tokenizer_mode"]]
    if recipe["tool_call_parser"]:
        args += ["--tool-call-parser", recipe["tool_call_parser"]]
        if recipe["enable_auto_tool_choice"]:
            args.append("--enable-auto-tool-choice")
    if recipe["reasoning_parser"]:
        args += ["--reasoning-parser", recipe["reasoning_parser"]]
    if engine["num_speculative_tokens"] and recipe["speculative_method"]:
        spec = {"num_speculative_tokens": engine["num_speculative_tokens"], "method": recipe["speculative_method"]}
        if engine["speculative_enforce_eager"]:
            spec["enforce_eager"] = True
        args += ["--speculative-config", compact_json(spec)]
    if engine["cudagraph_mode"] and not engine["enforce_eager"]:
        args += ["--compilation-config", compact_json({"cudagraph_mode": engine["cudagraph_mode"]})]
    return args


def compact_json(value):
    """JSON as the engine flags carry it: compact, keys in the builder's order."""
    return json.dumps(value, separators=(",", ":"))


#: where the proxy's host keeps, per proxy, the key each instance serves under (pd_proxy_drain: a restore
#: under traffic adds an instance back under an alias of its address; plugins/module_utils/pd_drain.py)
PROXY_STATE_DIR = "/var/lib/pd-deploy/proxy"

#: in the proxy's container: the backend lists of the plan as proxy flags, written by the deploy into the
#: running container after each wiring (community.docker.docker_container_copy_into). A container's own
#: filesystem survives a restart by Docker (daemon restart, crash, restart policy), so a restarted proxy
#: serves the plan, not its launch-time lists; the container spec stays the same when instances are
#: added or removed. The upstream proxy's flags are argparse ``nargs="+"`` options (vllm-ascend
#: examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py, parse_args, v0.23.0 L646-L649
#: .. main 182b75ea84 L674-L677): the file's lists, given after the launch-time ones, are the ones kept.
PROXY_BACKENDS_FILE = "/etc/pd-proxy-backends.args"
PROXY_SHELL = f'exec python3 "$0" "$@" $(cat {PROXY_BACKENDS_FILE} 2>/dev/null)'


def backends_args(ranks):
    """The proxy flags that list ``ranks`` ({prefill: [rank], decode: [rank]}), as the backends file holds
    them: one flag and its values per line."""
    lines = []
    for role, flag in (("prefill", "prefiller"), ("decode", "decoder")):
        lines.append(" ".join([f"--{flag}-hosts", *[r["address"] for r in ranks[role]]]))
        lines.append(" ".join([f"--{flag}-ports", *[str(r["port"]) for r in ranks[role]]]))
    return "\n".join(lines) + "\n"


#: proxy flags that list its backends: set live (/instances/add, /instances/remove), not in its hash
BACKEND_FLAGS = ("--prefiller-hosts", "--prefiller-ports", "--decoder-hosts", "--decoder-ports")


def spec_hash(spec):
    """sha256 of a launch spec without its labels (what the engine role compares).

    A proxy's backend lists (``backends`` and the values of BACKEND_FLAGS in its command) are left out:
    adding or removing P/D instances re-wires the running proxy (/instances/add, /instances/remove)
    instead of recreating it. Its command still names the backends of the launch, which a
    re-created proxy starts with; a proxy Docker restarts reads the plan's from PROXY_BACKENDS_FILE.
    """
    body = {k: v for k, v in spec.items() if k not in ("labels", "backends", "serving_file", "backends_file")}
    if spec.get("kind") == "proxy":
        body["command"] = _without_backends(spec["command"])
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _without_backends(command):
    out, skipping = [], False
    for arg in command:
        if arg in BACKEND_FLAGS:
            out.append(arg)
            skipping = True
        elif skipping and not arg.startswith("--"):
            continue
        else:
            skipping = False
            out.append(arg)
    return out


def _labels(cluster, spec, extra):
    labels = {
        "pd.cluster": cluster["name"],
        "pd.role": spec["role"],
        "pd.vllm-ascend-version": cluster["vllm_ascend_version"],
        "pd.managed-by": "pd-deploy",
        # the inventory host it runs on: what a host's Docker lists beyond it is not its own (and
        # not part of the hash: adding it recreated nothing)
        "pd.host": spec["host"],
    }
    labels.update(extra)
    labels["pd.spec-hash"] = spec_hash(spec)
    return labels


def rank_spec(cluster, inst, rank, host):
    """The launch spec of one engine rank (docs/design.md): argv, env, devices, mounts, shm."""
    role = rank["role"]
    rcfg = cluster["roles"][role]
    engine = rcfg["engine"]
    row = versions.version_row(cluster["vllm_ascend_version"])
    per_container, pinned = offload_bytes(cluster, role, host)
    kv_cfg = connectors.kv_transfer_config(rcfg, cluster, inst, row, per_container)
    add_cfg = connectors.additional_config(rcfg, row, engine["additional_config"])
    command = [
        "vllm", "serve", cluster["model"]["path"],
        "--served-model-name", cluster["model"]["served_name"],
        "--host", cluster["bind_host"], "--port", str(rank["port"]),
    ]
    # External DP flags only for DP > 1: vLLM reads --data-parallel-rank as "external load balancing"
    # and refuses it with one rank ("data_parallel_external_lb can only be set when
    # data_parallel_size > 1", vllm 0.27.1 vllm/config/parallel.py:483, set from data_parallel_rank in
    # vllm/engine/arg_utils.py:2075; seen on the real engine, molecule/real-engine).
    if inst["dp"] > 1:
        command += [
            "--data-parallel-size", str(inst["dp"]), "--data-parallel-rank", str(rank["dp_rank"]),
            "--data-parallel-address", inst["dp_address"],
            "--data-parallel-rpc-port", str(inst["dp_rpc_port"]),
        ]
    command += ["--tensor-parallel-size", str(inst["tp"])] + _flag_args(engine, cluster["recipe"])
    if kv_cfg:
        command += ["--kv-transfer-config", compact_json(kv_cfg)]
    if add_cfg:
        command += ["--additional-config", compact_json(add_cfg)]
    command += [str(a) for a in engine["extra_args"]]
    env = dict(cluster["env_common"])
    env.update({
        # the rank's NPUs as its container numbers them (all host NPUs mounted: docs/design.md)
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(d) for d in ports.visible_ids(host, rank["devices"])),
        "HCCL_IF_IP": host["address"],
        "GLOO_SOCKET_IFNAME": host["hccl_if"],
        "TP_SOCKET_IFNAME": host["hccl_if"],
        "HCCL_SOCKET_IFNAME": host["hccl_if"],
    })
    hccl_base = ports.hccl_base_port(cluster, rank)
    if hccl_base != ports.facts()["hccl"]["if_base_port_default"]:
        env["HCCL_IF_BASE_PORT"] = str(hccl_base)  # several instances share the host (docs/design.md)
    if engine["enable_prefix_caching"] and engine["prefix_cache_retention_interval"] is not None:
        env["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] = str(engine["prefix_cache_retention_interval"])
    if cluster["recipe"]["allocator_preload"] and row["image_has_jemalloc"]:
        env["LD_PRELOAD"] = cluster["recipe"]["allocator_preload"]
    env.update({str(k): str(v) for k, v in (rcfg["env"] or {}).items()})
    root = host["ascend_root"]
    # every NPU of the host, under its own name, so numbering inside equals the host's (design.md)
    devices = [f"{root}/dev/davinci{d}:/dev/davinci{d}" for d in host_npus(host)]
    devices += [f"{root}{d}:{d}" for d in ASCEND_CONTROL_DEVICES]
    volumes = [f"{root}{m}:{m}:ro" for m in ASCEND_MOUNTS]
    volumes.append(f"{cluster['model']['path']}:{cluster['model']['path']}:ro")
    spec = {
        "name": rank["container"],
        "kind": "engine",
        "cluster": cluster["name"],
        "role": role,
        "instance": rank["instance"],
        "dp_rank": rank["dp_rank"],
        "host": host["name"],
        "image": cluster["image"],
        "command": command,
        "env": env,
        "devices": devices,
        "volumes": volumes,
        "shm_size_bytes": shm_bytes(rcfg, pinned),
        "pinned_offload_bytes": pinned,
        "network_mode": "host",
        "privileged": bool(rcfg["privileged"]),
        "restart_policy": cluster["restart_policy"],
        "ports": {"http": rank["port"], "kv": [inst["kv_port"], inst["kv_port"] + inst["dp"] * inst["tp"]],
                  "dp_rpc": inst["dp_rpc_port"]},
        "health_url": f"http://127.0.0.1:{rank['port']}/health",
        "health_timeout_s": cluster["health_timeout_s"],
    }
    spec["labels"] = _labels(cluster, spec, {"pd.instance": str(rank["instance"]),
                                             "pd.dp-rank": str(rank["dp_rank"])})
    return spec


def proxy_spec(cluster, topo):
    """Launch spec of the cluster's PD proxy, wired to every prefill and decode rank."""
    name = cluster["name"]
    proxy = cluster["proxy"]
    host_name = proxy["host"] or next(
        (h for h, rec in topo["hosts"].items() if rec["role"] == "prefill"), None)
    if host_name not in topo["hosts"]:
        raise PdError(name, "proxy.host", f"{host_name!r} is not a host of this cluster",
                      f"set pd_cluster.proxy.host to one of: {', '.join(topo['hosts'])}")
    ranks = {role: [r for i in topo["instances"] if i["role"] == role for r in i["ranks"]]
             for role in ROLES}
    command = ["/bin/sh", "-c", PROXY_SHELL, proxy["script"], "--host", cluster["bind_host"], "--port", str(proxy["port"]),
               "--prefiller-hosts", *[r["address"] for r in ranks["prefill"]],
               "--prefiller-ports", *[str(r["port"]) for r in ranks["prefill"]],
               "--decoder-hosts", *[r["address"] for r in ranks["decode"]],
               "--decoder-ports", *[str(r["port"]) for r in ranks["decode"]],
               "--max-retries", str(proxy["max_retries"]), "--retry-delay", str(proxy["retry_delay"])]
    if proxy.get("waiting_retry_interval") is not None:
        command += ["--waiting-retry-interval", str(proxy["waiting_retry_interval"])]
    spec = {
        "name": f"pd-{name}-proxy",
        "kind": "proxy",
        "cluster": name,
        "role": "proxy",
        "host": host_name,
        "image": cluster["image"],
        "command": command,
        "env": {},
        "devices": [],
        "volumes": [],
        "shm_size_bytes": None,
        "pinned_offload_bytes": 0,
        "network_mode": "host",
        "privileged": False,
        "restart_policy": cluster["restart_policy"],
        "ports": {"http": proxy["port"]},
        "health_url": f"http://127.0.0.1:{proxy['port']}/healthcheck",
        # the instances it serves, as it lists them (address:port): the rollout re-wires a running
        # proxy to these (pd_proxy_drain state=wired)
        "backends": {role: [f"{r['address']}:{r['port']}" for r in ranks[role]] for role in ROLES},
        # on the proxy's host: the key each instance serves under (its address, or an alias of it after a
        # restore under traffic), which a run reads to tell a serving key from a tainted one
        "serving_file": f"{PROXY_STATE_DIR}/pd-{name}-proxy.serving.json",
        # the plan's backend lists, written into the running container after each wiring: what a
        # proxy restarted by Docker serves (its command reads them after the launch-time lists)
        "backends_file": {"path": PROXY_BACKENDS_FILE, "content": backends_args(ranks)},
        "health_timeout_s": 300,
    }
    spec["labels"] = _labels(cluster, spec, {})
    return spec
