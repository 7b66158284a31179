"""Decisions the container roles take on what Docker and the hosts report (plain data in, out)."""

import re

from pd_deploy.errors import PdError

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _label(info, key):
    container = (info or {}).get("container") or {}
    return ((container.get("Config") or {}).get("Labels") or {}).get(key)


def clean_log(text):
    """Container log text without the Docker stream framing bytes and control characters."""
    return _CONTROL.sub("", str(text or ""))


def containers_to_replace(specs, info_results):
    """Names of existing containers whose ``pd.spec-hash`` label differs from their spec.

    ``info_results`` are the loop results of docker_container_info over ``specs`` (same order).
    Those containers are stopped and kept as ``<name>-previous`` until the new one is healthy.
    """
    if not isinstance(specs, list) or not isinstance(info_results, list) or len(specs) != len(info_results):
        raise PdError("pd_containers_to_replace", "info_results",
                      "expected one docker_container_info result per launch spec",
                      "pass the .results of a docker_container_info loop over the same specs")
    out = []
    for spec, info in zip(specs, info_results):
        if info.get("exists") and _label(info, "pd.spec-hash") != spec["labels"]["pd.spec-hash"]:
            out.append(spec["name"])
    return out


def unhealthy_specs(health_register):
    """Specs whose health wait did not end with HTTP 200 (from the handler's register)."""
    results = (health_register or {}).get("results") or []
    return [r["item"] for r in results
            if not r.get("skipped") and r.get("status") != 200 and "item" in r]


def rollback_message(unhealthy, log_results, replaced, host):
    """One readable failure message: which containers failed, what was restored, log tails."""
    logs = {}
    for res in log_results or []:
        item = res.get("item") or {}
        text = res.get("content") or res.get("msg") or ""
        logs[item.get("name")] = clean_log(text).strip()
    lines = [f"{host}: {len(unhealthy)} container(s) never answered their health URL; "
             "this host is failed and the rollout stops here."]
    for spec in unhealthy:
        name = spec["name"]
        state = ("previous container restored and started" if name in (replaced or [])
                 else "no previous container existed; nothing is serving this rank now")
        lines.append(f"- {name} ({spec['health_url']}, waited {spec.get('health_timeout_s')} s): {state}.")
        tail = logs.get(name)
        if tail:
            lines.append("  last log lines:\n    " + "\n    ".join(tail.splitlines()[-15:]))
    lines.append("Fix the launch spec (playbooks/deploy-pd.yml -e pd_render_only=true shows it), "
                 "or run playbooks/collect-logs.yml for the full logs, then re-run the deploy.")
    return "\n".join(lines)


def listening_ports(ss_output):
    """TCP ports in LISTEN state from ``ss -Hltn`` output."""
    ports = set()
    for line in (ss_output or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            match = re.search(r":(\d+)$", fields[3])
            if match:
                ports.add(int(match.group(1)))
    return sorted(ports)


def spec_ports(spec):
    """Every TCP port a launch spec listens on: HTTP, DP RPC (rank 0) and the Mooncake range."""
    ports = spec.get("ports") or {}
    out = [ports["http"]] if "http" in ports else []
    if "dp_rpc" in ports and spec.get("dp_rank") == 0:
        out.append(ports["dp_rpc"])
    if "kv" in ports:
        low, high = ports["kv"]
        out.extend(range(low, high))  # [kv_port, kv_port + dp*tp): the next instance starts at the end
    return out


def port_conflicts(specs, in_use, own_running):
    """Precheck messages for ports of ``specs`` already taken by something not ours."""
    taken = set(in_use or [])
    mine = set(own_running or [])
    out = []
    for spec in specs:
        if spec["name"] in mine:
            continue
        busy = sorted(p for p in spec_ports(spec) if p in taken)
        if busy:
            out.append(f"ports {', '.join(map(str, busy))} needed by {spec['name']} are already in use — "
                       "stop what listens there or change port_base / kv_port / dp_rpc_port / proxy.port")
    return out


FILTERS = {
    "pd_clean_log": clean_log,
    "pd_containers_to_replace": containers_to_replace,
    "pd_unhealthy_specs": unhealthy_specs,
    "pd_rollback_message": rollback_message,
    "pd_listening_ports": listening_ports,
    "pd_spec_ports": spec_ports,
    "pd_port_conflicts": port_conflicts,
}
