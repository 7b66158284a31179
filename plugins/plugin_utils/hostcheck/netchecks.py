# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NPU network prechecks (hccn_tool), judged on the controller.

What is checked is what vllm-ascend's multi-node PD guide has operators do by hand on every node
(vllm-project/vllm-ascend main:docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md,
"Verify Multi-Node Communication", A2 steps 1-5): ``hccn_tool -i N -link -g`` must say UP,
``-net_health -g`` Success, ``-ip -g`` gives the NPU's address (which must be the ``address_N`` of
/etc/hccn.conf, the file Mooncake reads; issue 7711 shows a missing file serving wrong tokens),
``-tls -g`` "switch" must be the same on every node (issues 10224, 5638), and ``-ping -g address``
must reach the peer NPUs.

The pd_host_probe module runs the tool (its ``hccn`` option) and returns raw text; every decision is
here, as pure functions returning one message per problem naming host, device and fix.
"""

import re

from ..shared.errors import PdError

_DEVICE = re.compile(r"/dev/davinci(\d+)$")
_CONF = re.compile(r"^\s*address_(\d+)\s*=\s*(\S+)\s*$", re.M)
_LINK = re.compile(r"link status\s*:\s*(\w+)", re.I)
_HEALTH = re.compile(r"net health status\s*:\s*(\w+)", re.I)
_IP = re.compile(r"ipaddr\s*:\s*(\S+)", re.I)
_TLS = re.compile(r"tls switch\s*\[\s*(\d+)\s*\]", re.I)
_LOSS = re.compile(r"([\d.]+)\s*%\s*packet loss", re.I)

CONF_FIX = ("write address_N (and netmask_N) for every NPU into /etc/hccn.conf with hccn_tool -i N -ip -s "
            "address A netmask M, or restore the file from the host's network plan")


def devices(specs):
    """NPU indices the specs' /dev/davinciN devices use, sorted, no repeats."""
    out = set()
    for spec in specs or []:
        for entry in spec.get("devices") or []:
            match = _DEVICE.search(entry.split(":", 1)[0])
            if match:
                out.add(int(match.group(1)))
    return sorted(out)


def conf_addresses(text):
    """``{N: address}`` of /etc/hccn.conf's ``address_N=...`` lines (later lines win)."""
    return {int(n): ip for n, ip in _CONF.findall(text or "")}


def _first(rx, result):
    if not result or result.get("rc") != 0:
        return None
    match = rx.search(result.get("stdout") or "")
    return match.group(1) if match else None


def _why(result):
    if not result:
        return "not run"
    lines = ((result.get("stderr") or "") + "\n" + (result.get("stdout") or "")).strip().splitlines()
    why = f"rc {result.get('rc')}: {lines[0]}" if lines else f"rc {result.get('rc')}"
    # the probe asks again before a reading is judged (pd_host_probe HCCN_TRIES): say how often
    tries = result.get("tries")
    return f"{why}, after {tries} tries" if isinstance(tries, int) and tries > 1 else why


def device_state(hccn, device):
    """What the probe read for one NPU: ``{link, health, ip, tls, conf_ip, errors}``."""
    runs = ((hccn or {}).get("devices") or {}).get(str(device)) or {}
    state = {"link": _first(_LINK, runs.get("link")), "health": _first(_HEALTH, runs.get("net_health")),
             "ip": _first(_IP, runs.get("ip")), "tls": _first(_TLS, runs.get("tls")),
             "conf_ip": conf_addresses((hccn or {}).get("conf")).get(device), "errors": {}}
    for key, rx in (("link", _LINK), ("net_health", _HEALTH), ("ip", _IP), ("tls", _TLS)):
        result = runs.get(key)
        if _first(rx, result) is None:
            state["errors"][key] = _why(result)
    return state


def host_problems(host, hccn, npus):
    """Problems of one host's NPU network, one message per problem, each ``host: npu N: what — fix``.

    ``hccn`` is the probe's ``hccn`` result ({tool_ok, conf, devices: {"N": {link, net_health, ip, tls}}}),
    ``npus`` the NPU indices this host's ranks use.
    """
    if hccn is None:
        return []
    if not isinstance(hccn, dict):
        raise PdError("pd_hccn_problems", "hccn", f"is {type(hccn).__name__}, not the probe's hccn mapping")
    if hccn.get("skipped"):
        return []  # the host starts nothing in this run (pd_host_probe read only hccn.conf)
    out = []
    if hccn.get("tool_error"):
        return [f"{host}: hccn_tool could not run ({hccn['tool_error']}) — install the Ascend driver tools "
                "(/usr/local/Ascend/driver/tools/hccn_tool) or set pd_prechecks_hccn: false for this host"]
    if hccn.get("conf") is None:
        out.append(f"{host}: /etc/hccn.conf is missing — Mooncake reads each NPU's address from it (vllm-ascend "
                   f"issue 7711: without it the service starts and serves wrong tokens); {CONF_FIX}")
    for n in npus:
        st = device_state(hccn, n)
        where = f"{host}: npu {n}"
        for key, why in st["errors"].items():
            out.append(f"{where}: hccn_tool -i {n} -{key} -g gave no answer ({why}) — check the NPU driver and "
                       "firmware (npu-smi info) and that the device exists")
        if st["link"] is not None and st["link"].upper() != "UP":
            out.append(f"{where}: link status {st['link']} — check the NPU port's cable and switch port "
                       f"(hccn_tool -i {n} -lldp -g names it), then hccn_tool -i {n} -link -g must say UP")
        if st["health"] is not None and st["health"].lower() != "success":
            out.append(f"{where}: net health status {st['health']} — the NPU cannot reach its detect address; "
                       f"check hccn_tool -i {n} -netdetect -g and -gateway -g and the switch")
        if hccn.get("conf") is not None and st["conf_ip"] is None:
            out.append(f"{where}: /etc/hccn.conf has no address_{n} — {CONF_FIX}")
        elif st["ip"] is not None and st["conf_ip"] is not None and st["ip"] != st["conf_ip"]:
            out.append(f"{where}: hccn_tool -ip -g says {st['ip']} but /etc/hccn.conf says address_{n}="
                       f"{st['conf_ip']} — the file is stale: set address_{n}={st['ip']} in /etc/hccn.conf "
                       "(or re-apply the intended address with hccn_tool -ip -s) so Mooncake uses the live address")
    return out


def _cluster_hosts(plan):
    out = {}
    for name in sorted((plan or {}).get("hosts") or {}):
        host = plan["hosts"][name]
        if host.get("specs"):
            out.setdefault(host.get("cluster"), []).append(name)
    return out


def tls_problems(plan, probes):
    """TLS switch differences inside each cluster: one message per (host, NPU) off the cluster's usual value.

    The usual value is the one most NPUs of the cluster report (ties: the smaller value). Hosts whose
    probe has no hccn result are left out (their own problems say why).
    """
    out = []
    for cluster, names in _cluster_hosts(plan).items():
        seen = []
        for name in names:
            hccn = (probes.get(name) or {}).get("hccn")
            if not hccn or hccn.get("tool_error"):
                continue
            for n in devices(plan["hosts"][name]["specs"]):
                tls = device_state(hccn, n)["tls"]
                if tls is not None:
                    seen.append((name, n, tls))
        values = sorted({v for _host, _device, v in seen})
        if len(values) < 2:
            continue
        usual = max(values, key=lambda v: (sum(1 for s in seen if s[2] == v), -int(v)))
        for name, n, tls in seen:
            if tls != usual:
                out.append(f"{name}: npu {n}: TLS switch {tls} but {usual} on the other NPUs of cluster {cluster} — "
                           f"P and D cannot link with different TLS settings (vllm-ascend issues 10224, 5638): set "
                           f"it the same everywhere (hccn_tool -i {n} -tls -s enable {usual})")
    return out


def ping_targets(plan, probes):
    """What each prefill host pings: ``{host: [{device, address, peer, peer_device}]}``.

    Pairing: prefill NPU i of a cluster pings, on every decode host of that cluster, the decode NPU at
    position i (modulo that host's NPU count) of its sorted NPU list, at the address its /etc/hccn.conf
    gives (what Mooncake uses), else what ``hccn_tool -ip -g`` said. Decode NPUs without an address
    are skipped here: their own host problems name them.
    """
    out = {}
    for names in _cluster_hosts(plan).values():
        prefill = [n for n in names if plan["hosts"][n].get("role") == "prefill"]
        decode = [n for n in names if plan["hosts"][n].get("role") == "decode"]
        for p in prefill:
            p_npus = devices(plan["hosts"][p]["specs"])
            rows = []
            for d in decode:
                d_npus = devices(plan["hosts"][d]["specs"])
                hccn = (probes.get(d) or {}).get("hccn")
                if not d_npus or not hccn or hccn.get("tool_error"):
                    continue
                for i, n in enumerate(p_npus):
                    peer = d_npus[i % len(d_npus)]
                    st = device_state(hccn, peer)
                    address = st["conf_ip"] or st["ip"]
                    if address:
                        rows.append({"device": n, "address": address, "peer": d, "peer_device": peer})
            if rows:
                out[p] = rows
    return out


def ping_problems(host, targets, results):
    """Failed pings of one prefill host: ``results`` is the probe's ``hccn.ping`` list (same order as ``targets``)."""
    out = []
    by_key = {(r.get("device"), r.get("address")): r for r in results or []}
    for t in targets or []:
        r = by_key.get((t["device"], t["address"]))
        match = _LOSS.search((r or {}).get("stdout") or "")
        # healthy: "0.00% packet loss"; unreachable: "recv time out seq=N" lines and 100% loss
        # (sources in the module docstring and ping_problems' row in docs/guide/troubleshoot.md)
        if r is not None and r.get("rc") == 0 and match and float(match.group(1)) < 100:
            continue
        what = f"{match.group(1)}% packet loss" if match else _why(r)
        out.append(f"{host}: npu {t['device']}: cannot reach decode {t['peer']} npu {t['peer_device']} at "
                   f"{t['address']} ({what}) — KV transfer from this prefill NPU will stall; check both NPUs' "
                   f"links, VLAN/routes between them (hccn_tool -i {t['device']} -ping -g address {t['address']})")
    return out


def cluster_problems(plan, probes):
    """Every hccn problem of the play: each host's own, then TLS differences, then failed pings.

    ``probes``: ``{host: probe result}``; a probe's ``hccn.ping`` (when the ping pass ran) holds the
    ping results of that prefill host.
    """
    if not isinstance(probes, dict):
        raise PdError("pd_hccn_problems", "probes", f"is {type(probes).__name__}, not a mapping of host to probe")
    out = []
    for name in sorted(probes):
        host = ((plan or {}).get("hosts") or {}).get(name) or {}
        out.extend(host_problems(name, (probes[name] or {}).get("hccn"), devices(host.get("specs"))))
    out.extend(tls_problems(plan, probes))
    return out


def ping_request(targets):
    """The probe's ``hccn.ping`` option from one host's targets: ``[{device, address}]``."""
    return [{"device": t["device"], "address": t["address"]} for t in targets or []]
