# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Take engine ranks out of a running PD proxy before they are replaced, and put them back after.

Follows vllm-ascend's proxy (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py; the
parts used here are the same at v0.23.0 5cb98caaad, v0.24.0rc1 412cda2681, v0.25.1rc1 9bf964cb4b,
releases/v0.26.0rc cf0baa38df and main 182b75ea84; docs/design.md, "Restore under continuous traffic"):

- ``POST /instances/remove {type, instances: ["host:port"]}`` drops the instances at once when the
  proxy has no request in flight at all; otherwise it only *taints* them (``remove_instances``): they
  stay listed and are picked last (``_priority``, TAINT_PRIORITY), so they get no new request while
  another instance of the role is listed, and leave the list only when the proxy is idle at one of
  its listener's checks (``finalize_tainted_instances``, every --waiting-retry-interval s). Under
  traffic that never pauses that never happens. The proxy taints a key it does not list as well.
- ``POST /instances/add`` ignores a key that is listed (tainted or not) or waiting; a new key waits
  until its ``/v1/models`` answers, then is listed (``activate_waiting_instance``; a key that carries a
  taint without being listed is only untainted there, never listed - main then fails on the missing
  entry). Keys are ``server_key(host, port)``: the host text with "localhost" and "127.0.0.1" replaced
  by "0.0.0.0"; the instance text is split at ":" (``parse_server_addresses``), so an IPv6 literal
  cannot be added or removed over HTTP at all.

So the instance a drain tainted cannot be untainted while traffic flows, and its key cannot be added
again. The restore therefore brings the same engine back under another spelling of its address (an
*alias*: the same host and port, a key the proxy does not list, see ``alias``); the tainted key
leaves the list whenever the proxy idles. Instances are compared by the endpoint they reach
(``endpoint``), never by text. Which alias serves each instance is recorded on the proxy's host (the
state file) before the drain taints the old one, so a later run tells the serving key from a tainted
one without asking the proxy (which does not say). A remove is only ever sent for a key that serves
(never for a tainted one the proxy may drop meanwhile, which would leave a taint on an unlisted key).
"""

import json
import os
import re
import string
import tempfile
import time
import urllib.parse

from ansible_collections.pd.deploy.plugins.module_utils.pd_http import container_gone, docker, request

_IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)
ROLES = ("prefill", "decode")


def in_flight(metrics_text):
    """Requests an engine runs or queues, from its Prometheus text (None when it exposes neither)."""
    found = _IN_FLIGHT.findall(metrics_text or "")
    return int(sum(float(v) for v in found)) if found else None


def _split(key):
    """("host", "port") of an ``address:port`` key (the port after the last colon)."""
    host, _sep, port = str(key).rpartition(":")
    return host, port


def _ipv4(host):
    """The IPv4 address ``host`` spells in any form the C library's inet_aton reads (dotted decimal,
    hexadecimal 0x.., octal 0.., one to four parts, the last filling the remaining bytes), as an int, or
    None."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        text = part.lower()
        try:
            if text.startswith("0x"):
                value = int(text[2:] or "0", 16)
            elif len(text) > 1 and text.startswith("0"):
                value = int(text[1:], 8)
            else:
                value = int(text, 10) if text.isdigit() else None
        except ValueError:
            return None
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    out = 0
    for v in head:
        out = out * 256 + v
    return out * 256 ** (4 - len(head)) + last


def _dotted(value):
    return ".".join(str(value >> shift & 255) for shift in (24, 16, 8, 0))


def endpoint(key):
    """The endpoint an ``address:port`` key reaches, the same for every alias of it: an IPv4 address in
    dotted decimal (127.0.0.1, localhost and 0.0.0.0 as 0.0.0.0, which the proxy itself counts as one),
    a hostname in lower case, an IPv6 literal compressed."""
    host, port = _split(key)
    host = host.strip("[]")
    value = _ipv4(host)
    if value is not None:
        host = _dotted(value)
    elif ":" in host:
        import ipaddress  # noqa: PLC0415 - only IPv6 literals need it
        try:
            address = ipaddress.ip_address(host)
            host = _dotted(int(address.ipv4_mapped)) if getattr(address, "ipv4_mapped", None) else address.compressed
        except ValueError:
            pass
    else:
        host = host.lower()
    if host in ("127.0.0.1", "localhost"):
        host = "0.0.0.0"
    return f"{host}:{port}"


def proxy_key(key):
    """The proxy's own key of an ``address:port`` instance (server_key: plain text replacement)."""
    host, port = _split(key)
    return f"{host.replace('localhost', '0.0.0.0').replace('127.0.0.1', '0.0.0.0')}:{port}"


def alias(key, generation):
    """Spelling number ``generation`` of the address of ``key`` (0: ``key`` itself), or None when the
    address has no more: every spelling reaches the same host and port under a different proxy key.

    IPv4 address a.b.c.d: the first byte in hexadecimal with more leading zeros each generation
    (0xa.0.1.12, 0x0a.0.1.12, ...; read by inet_aton, which the proxy's HTTP client reaches through
    getaddrinfo; httpx refuses a dotted-decimal form with leading zeros, so decimal ones are not used).
    Hostname: its letters in upper/lower case (DNS and /etc/hosts ignore case), 2^letters - 1
    generations. IPv6 literal: none (the proxy cannot take it over HTTP, see above).
    """
    if generation == 0:
        return key
    host, port = _split(key)
    if host == "localhost":
        host = "127.0.0.1"
    value = _ipv4(host)
    if value is not None:
        rest = _dotted(value).split(".", 1)[1]
        return f"0x{'0' * (generation - 1)}{value >> 24:x}.{rest}:{port}"
    letters = [i for i, c in enumerate(host) if c in string.ascii_letters]
    if ":" in host or not letters or generation >= 2 ** len(letters):
        return None
    chars = list(host.lower())
    for bit, index in enumerate(letters):
        if generation >> bit & 1:
            chars[index] = chars[index].upper()
    return "".join(chars) + f":{port}"


def next_alias(key, listed):
    """The first spelling of ``key``'s address whose proxy key ``listed`` (what the proxy lists) does not
    hold: the proxy takes it as a new instance. None when every spelling is listed."""
    taken = {proxy_key(k) for k in listed}
    generation = 0
    while True:
        form = alias(key, generation)
        if form is None:
            return None
        if proxy_key(form) not in taken:
            return form
        generation += 1


def _listed(answer, role):
    """The instances the proxy lists for ``role``, in its order (oldest first)."""
    return list(answer.get(f"current_{role}_instances") or [])


def _adjust(proxy_url, mode, role, keys, send, timeout):
    """One POST /instances/<mode>: (answer dict or None, error text)."""
    status, body, error = send(f"{proxy_url}/instances/{mode}", "POST", {"type": role, "instances": list(keys)},
                               timeout)
    if status != 200:
        return None, error or f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
    try:
        answer = json.loads(body)
    except ValueError:
        return None, f"not JSON: {body[:200].decode('utf-8', 'replace')}"
    if not isinstance(answer, dict) or answer.get("error"):
        return None, str(answer.get("error") if isinstance(answer, dict) else answer)
    return answer, ""


def listed_instances(proxy_url, timeout=5.0, send=request):
    """{prefill: [keys], decode: [keys]} a running proxy lists (in its order), read with an empty
    /instances/add (which changes nothing), or {error: text}."""
    out = {}
    for role in ROLES:
        answer, error = _adjust(proxy_url, "add", role, [], send, timeout)
        if answer is None:
            return {"error": error}
        out[role] = _listed(answer, role)
    return out


def started_at(docker_socket, container):
    """When Docker last started the proxy's container (its State.StartedAt), or "" when not known."""
    if not (docker_socket and container):
        return ""
    status, body, _error = docker(docker_socket, "GET", f"/containers/{urllib.parse.quote(container, safe='')}/json")
    return str(((body or {}).get("State") or {}).get("StartedAt") or "") if status == 200 and isinstance(body, dict) else ""


def load_serving(path, started=""):
    """{role: {endpoint: key}} recorded in the state file at ``path``; empty when there is none, or when it
    was written for another start of the proxy (``started``: a restarted proxy lists its command line
    again, without the aliases and taints of the one before)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or data.get("started", "") != started:
        data = {}
    return {role: dict(data.get(role) or {}) for role in ROLES}


def save_serving(path, serving, started=""):
    """Write ``serving`` to ``path`` at once (a temporary file renamed over it)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".serving-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(dict({"started": started}, **{role: dict(sorted(serving.get(role, {}).items())) for role in ROLES}),
                  out, indent=1)
    os.replace(tmp, path)


def recorder(serving, path="", started=""):
    """A ``record(role, {key: alias})`` that notes in ``serving`` ({role: {endpoint: key}}) the key each
    instance serves under ("" for one that serves under none: drained out, its keys tainted) and writes
    it to ``path`` (when given, for the proxy start ``started``) at once."""
    def record(role, done):
        for key, form in done.items():
            serving.setdefault(role, {})[endpoint(key)] = form or ""
        if path:
            save_serving(path, serving, started)
    return record


def serving_key(key, listed, recorded=None):
    """The listed key through which the proxy sends ``key``'s endpoint requests, or None.

    ``recorded`` is the key the state file holds for the endpoint: it serves when listed (any other
    alias of it was tainted before it was added); "" records that none serves. Without a record, the
    alias the proxy listed last (the newest: a drain taints every older one before the next is added)."""
    ep = endpoint(key)
    aliases = [k for k in listed if endpoint(k) == ep]
    if recorded == "":
        return None
    if recorded:
        return next((k for k in aliases if proxy_key(k) == proxy_key(recorded)), None)
    return aliases[-1] if aliases else None


def serving_view(listed, want, serving):
    """{role: [keys]} the proxy serves, of ``listed`` (listed_instances) read with ``serving`` (the state
    file): a planned instance (a key of ``want``) that serves under any alias reads as its planned key,
    any other endpoint that serves as its serving key; tainted aliases not at all."""
    out = {}
    for role in ROLES:
        recorded = (serving or {}).get(role, {})
        planned = {endpoint(k): k for k in (want or {}).get(role, [])}
        seen = {}
        for k in listed.get(role, []):
            ep = endpoint(k)
            if ep not in seen:
                seen[ep] = serving_key(k, listed[role], recorded.get(ep))
        out[role] = sorted(planned.get(ep, key) for ep, key in seen.items() if key)
    return out


def _engines_busy(keys, send, timeout):
    """{key: requests in flight} of the engines that have some (an engine that does not answer has none)."""
    busy = {}
    for key in keys:
        status, body, _error = send(f"http://{key}/metrics", "GET", None, timeout)
        count = in_flight(body.decode("utf-8", "replace")) if status == 200 else None
        if count:
            busy[key] = count
    return busy


def drain(proxy_url, role, keys, timeout_s, interval_s=0.5, request_timeout=5.0,
          clock=time.monotonic, sleep=time.sleep, send=request, serving=None, record=None):
    """Ask the proxy to remove the serving key of each of ``keys`` and wait until it is unlisted or its
    engine idle (bounded by ``timeout_s``).

    ``serving`` is {endpoint: key} from the state file. Before the remove, ``record({key: alias})`` is
    called with the spelling each instance comes back under (``rejoin``): the first one the proxy does
    not list. Returns {drained: bool, removed: [keys unlisted], isolated: [keys still listed, tainted],
    in_flight: {key: n} at the end, rejoin: {key: alias}, waited_s, error: text when the proxy did not
    answer}.
    """
    start = clock()
    keys = list(keys)
    serving = serving or {}
    out = {"drained": False, "removed": [], "isolated": [], "in_flight": {}, "rejoin": {}, "waited_s": 0.0,
           "error": ""}
    targets, sent, idle_rounds = None, False, 0
    while True:
        answer, error = _adjust(proxy_url, "add", role, [], send, request_timeout)
        out["error"] = error
        if answer is not None:
            listed = _listed(answer, role)
            if targets is None:
                # {instance: the key it serves under now}; instances the proxy does not list serve nowhere
                targets = {k: serving_key(k, listed, serving.get(endpoint(k))) for k in keys}
                out["rejoin"] = {k: next_alias(k, listed) for k in keys}
                if record:
                    record(out["rejoin"])
            live = {proxy_key(k) for k in listed}
            serving_now = [t for t in targets.values() if t]
            if not sent and serving_now:
                # once only: a second remove after the proxy dropped the key would taint an unlisted key
                removed, error = _adjust(proxy_url, "remove", role, serving_now, send, request_timeout)
                out["error"] = error
                sent = removed is not None
                if removed is not None:
                    live = {proxy_key(k) for k in _listed(removed, role)}
            out["removed"] = [k for k, t in targets.items() if not t or proxy_key(t) not in live]
            out["isolated"] = [k for k, t in targets.items() if t and proxy_key(t) in live]
            if sent or not serving_now:
                out["in_flight"] = _engines_busy(out["isolated"], send, request_timeout)
                # idle twice in a row: a request the proxy picked just before the taint has reached it
                idle_rounds = idle_rounds + 1 if not out["in_flight"] else 0
                if not out["isolated"] or idle_rounds >= 2:
                    out["drained"] = True
                    out["waited_s"] = round(clock() - start, 1)
                    return out
        out["waited_s"] = round(clock() - start, 1)
        if clock() - start >= timeout_s:
            if out["rejoin"] == {} and keys:
                out["rejoin"] = {k: k for k in keys}
            return out
        sleep(interval_s)


def restore(proxy_url, role, keys, timeout_s=60.0, interval_s=0.5, request_timeout=5.0,
            clock=time.monotonic, sleep=time.sleep, send=request, record=None):
    """Put ``keys`` back in the proxy and wait until each serves again (bounded by ``timeout_s``).

    Each comes back under the first spelling of its address the proxy does not list (``next_alias``: its
    plain address once the proxy dropped the tainted key, else an alias). ``record({key: alias})`` is
    called for the instances listed at the end.
    Returns {restored: bool, listed: [keys], missing: [keys not listed], missing_as: [the spelling each
    missing one was added under], add_as: {key: alias}, waited_s, error}.
    """
    start = clock()
    keys = list(keys)
    out = {"restored": False, "listed": [], "missing": keys, "missing_as": keys, "add_as": {}, "waited_s": 0.0,
           "error": ""}
    while True:
        answer, error = _adjust(proxy_url, "add", role, [], send, request_timeout)
        if answer is not None:
            listed = _listed(answer, role)
            for k in keys:
                if k not in out["add_as"]:
                    out["add_as"][k] = next_alias(k, listed) or k
            wanted = [a for a in out["add_as"].values() if proxy_key(a) not in {proxy_key(x) for x in listed}]
            if wanted:
                answer, error = _adjust(proxy_url, "add", role, wanted, send, request_timeout)
        out["error"] = error
        if answer is not None:
            live = {proxy_key(x) for x in _listed(answer, role)}
            out["listed"] = [k for k in keys if proxy_key(out["add_as"][k]) in live]
            out["missing"] = [k for k in keys if k not in out["listed"]]
        out["missing_as"] = [out["add_as"].get(k, k) for k in out["missing"]]
        out["waited_s"] = round(clock() - start, 1)
        if answer is not None and not out["missing"]:
            out["restored"] = True
        if out["restored"] or clock() - start >= timeout_s:
            if record and out["listed"]:
                record({k: out["add_as"][k] for k in out["listed"]})
            return out
        sleep(interval_s)


def wire(proxy_url, want, timeout_s, interval_s=0.5, request_timeout=5.0,
         clock=time.monotonic, sleep=time.sleep, send=request, serving=None, record=None, drop=True):
    """Make a running proxy serve exactly ``want`` ({prefill: [keys], decode: [keys]}), compared by
    endpoint (any alias of an instance counts as it; a tainted one does not serve).

    The missing instances are added first and waited for (listed), so that a role never loses its last
    serving instance; then (with ``drop``) each instance it serves beyond ``want`` is drained out (remove,
    wait until unlisted or idle). Aliases a restore left tainted are not touched: the proxy drops them
    when it idles. ``serving`` {role: {endpoint: key}} is the state file; ``record(role, {key: alias})`` is
    told what serves, ``record(role, {key: None})`` what left. ``wired`` is whether every wanted instance
    serves. Returns {wired, removed: {role: [keys]}, added: {role: [keys]}, drains: {role: result},
    restores: {role: result}, serving: {role: [keys]} at the end (serving_view), error}.
    """
    serving = serving or {}
    now = listed_instances(proxy_url, request_timeout, send)
    out = {"wired": False, "removed": {}, "added": {}, "drains": {}, "restores": {}, "serving": {},
           "error": now.get("error", "")}
    if "error" in now:
        return out
    ok = True
    extras = {}
    for role in ROLES:
        recorded = serving.get(role, {})
        planned = list(want.get(role, []))
        missing = [k for k in planned if not serving_key(k, now[role], recorded.get(endpoint(k)))]
        if missing:
            res = restore(proxy_url, role, missing, timeout_s, interval_s, request_timeout, clock, sleep, send,
                          record=(lambda done, role=role: record(role, done)) if record else None)
            out["restores"][role] = res
            out["added"][role] = missing
            ok = ok and res["restored"]
        elif record:
            record(role, {k: serving_key(k, now[role], recorded.get(endpoint(k))) for k in planned})
        mine = {endpoint(k) for k in planned}
        gone = {}
        for k in now[role]:
            ep = endpoint(k)
            if ep not in mine and ep not in gone:
                gone[ep] = serving_key(k, now[role], recorded.get(ep))
        # an endpoint listed only under tainted keys (drained out, dropped when the proxy idles) serves
        # nowhere: nothing to drain (a None key here used to be "removed" again on every re-run)
        extras[role] = sorted(k for k in gone.values() if k)
    for role in ROLES:
        if drop and extras[role]:
            res = drain(proxy_url, role, extras[role], timeout_s, interval_s, request_timeout, clock, sleep, send,
                        serving={endpoint(k): k for k in extras[role]})
            # a tainted instance is never picked while another one is listed: its container can go
            # even when the bound ended the wait (the result says so)
            out["drains"][role] = res
            out["removed"][role] = extras[role]
            if record:
                record(role, {k: None for k in extras[role]})
    out["wired"] = ok
    after = listed_instances(proxy_url, request_timeout, send)
    out["serving"] = {} if "error" in after else serving_view(after, want, serving)
    return out


def proxy_down(proxy_url, container="", docker_socket="", timeout=5.0, send=request, gone=container_gone):
    """Why the proxy itself is down, asked after a drain, restore or wiring that did not end well, or "".

    Its container (when named) exited, died, crash-loops or is gone (Docker's answer), or the proxy does not
    answer an empty /instances/add (no HTTP answer at all): then the failure is the proxy's, not the ranks'.
    A proxy that answers (even with an error about an instance) is up: "".
    """
    why = gone(docker_socket, container) if container and docker_socket else None
    if why:
        return f"its container {container}: {why}"
    status, _body, error = send(f"{proxy_url}/instances/add", "POST", {"type": "prefill", "instances": []}, timeout)
    if status == 0:
        return f"it does not answer on {proxy_url} ({error or 'no answer'})"
    return ""
