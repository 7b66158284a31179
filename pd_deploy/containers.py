"""Decisions the container roles take on what Docker and the hosts report (plain data in, out)."""

import base64
import binascii
import re
from collections.abc import Mapping

from pd_deploy.errors import PdError

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _label(info, key):
    container = (info or {}).get("container") or {}
    return ((container.get("Config") or {}).get("Labels") or {}).get(key)


def docker_log_text(raw):
    """Text of a Docker Engine API log body: de-framed when multiplexed, decoded as UTF-8.

    Without a TTY the API sends frames ``[stream (1 byte), 0, 0, 0, size (4 bytes, big endian)]`` +
    payload; with a TTY it sends the raw stream. ``raw`` is bytes, or text in which undecodable bytes
    are surrogate-escaped. Undecodable bytes become U+FFFD.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    if not isinstance(raw, (bytes, bytearray)):
        raise PdError("pd_docker_logs", "content", f"{type(raw).__name__} is not a log body",
                      "pass the bytes of GET /containers/<name>/logs or slurp's base64 content")
    data, out, pos = bytes(raw), [], 0
    while pos + 8 <= len(data) and data[pos] in (0, 1, 2) and data[pos + 1:pos + 4] == b"\0\0\0":
        size = int.from_bytes(data[pos + 4:pos + 8], "big")
        out.append(data[pos + 8:pos + 8 + size])
        pos += 8 + size
    body = b"".join(out) + data[pos:] if out else data
    return body.decode("utf-8", "replace")


def clean_log(text):
    """Readable log text: Docker's stream framing and control characters removed."""
    return _CONTROL.sub("", docker_log_text(text or ""))


def log_tail(text, lines=15, indent="    "):
    """The last ``lines`` lines of a container log, cleaned and indented for a failure message."""
    tail = clean_log(text).strip()
    return indent + f"\n{indent}".join(tail.splitlines()[-lines:]) if tail else ""


def docker_logs(slurp_results):
    """``{container name: log text}`` from a ``slurp`` loop over downloaded Docker API log bodies.

    Each result's ``item`` is the ``uri`` download result, whose ``item`` is the launch spec
    (roles/pd_container/tasks/read_logs.yml). Results without content (not read) are left out.
    """
    if not isinstance(slurp_results, (list, tuple)):
        raise PdError("pd_docker_logs", "results", f"{type(slurp_results).__name__} is not a list",
                      "pass the slurp loop's .results")
    out = {}
    for res in slurp_results:
        if not isinstance(res, Mapping) or res.get("content") is None:
            continue
        item = res.get("item") or {}
        spec = item.get("item") if isinstance(item.get("item"), Mapping) else item
        name = spec.get("name")
        if name:
            try:
                body = base64.b64decode(res["content"], validate=True)
            except (binascii.Error, ValueError):
                body = res["content"]
            out[name] = clean_log(body)
    return out


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


def rollback_message(unhealthy, logs, replaced, host, restored_unhealthy=None):
    """One readable failure message: which containers failed, what was restored, log tails.

    ``logs`` is ``{container name: log text}`` (pd_docker_logs); ``restored_unhealthy`` names the
    restored previous containers that did not answer their health URL either.
    """
    logs = logs or {}
    lines = [f"{host}: {len(unhealthy)} container(s) never answered their health URL; "
             "this host is failed and the rollout stops here."]
    for spec in unhealthy:
        name = spec["name"]
        if name not in (replaced or []):
            state = "no previous container existed; nothing is serving this rank now"
        elif name in (restored_unhealthy or []):
            state = "previous container restored and started, but it does not answer its health URL either"
        else:
            state = "previous container restored and healthy"
        lines.append(f"- {name} ({spec['health_url']}, waited {spec.get('health_timeout_s')} s): {state}.")
        tail = log_tail(logs.get(name))
        if tail:
            lines.append("  last log lines:\n" + tail)
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
    "pd_docker_logs": docker_logs,
    "pd_containers_to_replace": containers_to_replace,
    "pd_unhealthy_specs": unhealthy_specs,
    "pd_rollback_message": rollback_message,
    "pd_listening_ports": listening_ports,
    "pd_spec_ports": spec_ports,
    "pd_port_conflicts": port_conflicts,
}
