"""Take engine ranks out of a running PD proxy before they are replaced, and put them back after.

Follows vllm-ascend's proxy (examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py,
read at main 182b75ea84 and at v0.23.0 5cb98caaad: remove_instances, add_instances,
activate_waiting_instance and finalize_tainted_instances behave the same on both):

- ``POST /instances/remove {type, instances: ["host:port"]}`` drops the instances at once when the
  proxy has no request in flight at all; otherwise it only *isolates* them (tainted: they stay listed,
  are picked last, so they get no new request while another instance of the role is listed) and drops
  them the next time the proxy is idle (its listener checks every --waiting-retry-interval s,
  default 10). The answer lists the instances still listed (``current_<role>_instances``).
- ``POST /instances/add`` ignores an instance that is still listed (an isolated one stays isolated);
  an unlisted one waits until its ``/v1/models`` answers (checked every --waiting-retry-interval s,
  dropped after --max-waiting-retries), then is listed.

So a drain asks for the removal and waits until each rank is unlisted or its engine has nothing in
flight (vllm:num_requests_running + vllm:num_requests_waiting from its /metrics); a restore first
waits for an isolated rank to be dropped (asking again, which drops it at once when the proxy is
idle), then adds it back and waits until it is listed. Both are bounded; they report, never raise.
"""

import json
import re
import time

from ansible.module_utils.pd_http import container_gone, request

_IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def in_flight(metrics_text):
    """Requests an engine runs or queues, from its Prometheus text (None when it exposes neither)."""
    found = _IN_FLIGHT.findall(metrics_text or "")
    return int(sum(float(v) for v in found)) if found else None


def _listed(answer, role):
    return set(answer.get(f"current_{role}_instances") or [])


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
    """{prefill: [keys], decode: [keys]} a running proxy lists, read with an empty /instances/add (which
    changes nothing), or {error: text}."""
    out = {}
    for role in ("prefill", "decode"):
        answer, error = _adjust(proxy_url, "add", role, [], send, timeout)
        if answer is None:
            return {"error": error}
        out[role] = sorted(_listed(answer, role))
    return out


def _engines_busy(keys, send, timeout):
    """{key: requests in flight} of the engines that have some (an engine that does not answer has none)."""
    busy = {}
    for key in keys:
        status, body, _ = send(f"http://{key}/metrics", "GET", None, timeout)
        count = in_flight(body.decode("utf-8", "replace")) if status == 200 else None
        if count:
            busy[key] = count
    return busy


def drain(proxy_url, role, keys, timeout_s, interval_s=0.5, request_timeout=5.0,
          clock=time.monotonic, sleep=time.sleep, send=request):
    """Ask the proxy to remove ``keys`` and wait until each is unlisted or idle (bounded by ``timeout_s``).

    Returns {drained: bool, removed: [keys unlisted], isolated: [keys still listed], in_flight: {key: n}
    at the end, waited_s, error: text when the proxy did not answer}.
    """
    start = clock()
    keys = list(keys)
    out = {"drained": False, "removed": [], "isolated": keys, "in_flight": {}, "waited_s": 0.0, "error": ""}
    idle_rounds = 0
    while True:
        answer, error = _adjust(proxy_url, "remove", role, keys, send, request_timeout)
        if answer is None:
            out["error"] = error
        else:
            listed = _listed(answer, role)
            out["removed"] = [k for k in keys if k not in listed]
            out["isolated"] = [k for k in keys if k in listed]
        out["in_flight"] = _engines_busy(out["isolated"], send, request_timeout)
        # idle twice in a row: a request the proxy picked just before the isolation has reached it
        idle_rounds = idle_rounds + 1 if not out["in_flight"] else 0
        out["waited_s"] = round(clock() - start, 1)
        if answer is not None and (not out["isolated"] or idle_rounds >= 2):
            out["drained"] = True
            return out
        if clock() - start >= timeout_s:
            return out
        sleep(interval_s)


def restore(proxy_url, role, keys, isolated, timeout_s, interval_s=0.5, request_timeout=5.0,
            clock=time.monotonic, sleep=time.sleep, send=request):
    """Put ``keys`` back in the proxy and wait until each is listed again (bounded by ``timeout_s``).

    ``isolated`` are the keys the drain left listed (isolated): the proxy ignores an add for them, so
    they are asked to be removed until unlisted first. Returns {restored: bool, listed: [keys],
    missing: [keys not listed], still_isolated: [keys], waited_s, error}.
    """
    start = clock()
    keys = list(keys)
    pending_removal = set(isolated or [])
    out = {"restored": False, "listed": [], "missing": keys, "still_isolated": sorted(pending_removal),
           "waited_s": 0.0, "error": ""}
    while True:
        if pending_removal:
            answer, error = _adjust(proxy_url, "remove", role, sorted(pending_removal), send, request_timeout)
            if answer is not None:
                pending_removal &= _listed(answer, role)
        answer, error = _adjust(proxy_url, "add", role, [k for k in keys if k not in pending_removal], send,
                                request_timeout)
        out["error"] = error
        if answer is not None:
            listed = _listed(answer, role)
            out["listed"] = [k for k in keys if k in listed and k not in pending_removal]
            out["missing"] = [k for k in keys if k not in out["listed"]]
        out["still_isolated"] = sorted(pending_removal)
        out["waited_s"] = round(clock() - start, 1)
        if answer is not None and not out["missing"]:
            out["restored"] = True
            return out
        if clock() - start >= timeout_s:
            return out
        sleep(interval_s)


def wire(proxy_url, want, timeout_s, interval_s=0.5, request_timeout=5.0,
         clock=time.monotonic, sleep=time.sleep, send=request):
    """Re-wire a running proxy to ``want`` ({prefill: [keys], decode: [keys]}): instances it lists but
    ``want`` does not are drained out (remove, wait until unlisted or idle), the missing ones added (wait
    until listed). Each bounded by ``timeout_s``; ``wired`` is whether every missing instance is listed
    now (a drain that ended on its bound leaves an isolated instance, which the proxy no longer picks).
    Returns {wired: bool, removed: {role: [keys]}, added:
    {role: [keys]}, drains: {role: drain result}, restores: {role: restore result}, error}.
    """
    now = listed_instances(proxy_url, request_timeout, send)
    out = {"wired": False, "removed": {}, "added": {}, "drains": {}, "restores": {}, "error": now.get("error", "")}
    if "error" in now:
        return out
    ok = True
    for role in ("prefill", "decode"):
        extra = [k for k in now[role] if k not in want.get(role, [])]
        missing = [k for k in want.get(role, []) if k not in now[role]]
        if extra:
            res = drain(proxy_url, role, extra, timeout_s, interval_s, request_timeout, clock, sleep, send)
            # an isolated instance is never picked while another one is listed: its container can go
            # even when the bound ended the wait (the result says so)
            out["drains"][role] = res
            out["removed"][role] = extra
        if missing:
            res = restore(proxy_url, role, missing, [], timeout_s, interval_s, request_timeout, clock, sleep, send)
            out["restores"][role] = res
            out["added"][role] = missing
            ok = ok and res["restored"]
    out["wired"] = ok
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
    status, _, error = send(f"{proxy_url}/instances/add", "POST", {"type": "prefill", "instances": []}, timeout)
    if status == 0:
        return f"it does not answer on {proxy_url} ({error or 'no answer'})"
    return ""
