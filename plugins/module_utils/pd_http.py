# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HTTP for pd-deploy's modules: the engines' loopback URLs and the Docker Engine API socket.

Runs on the target host's Python, standard library only. http.client is used directly (not urllib)
so that an http_proxy variable in the host's environment never reroutes a loopback probe.
"""

import http.client
import json
import socket
import time
import urllib.parse


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the Docker Engine API)."""

    def __init__(self, socket_path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _exchange(conn, method, path, body, timeout, extra_headers=None):
    headers = dict(extra_headers or {}, Host="localhost")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), ""
    except (OSError, http.client.HTTPException) as exc:
        return 0, b"", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    finally:
        conn.close()


def request(url, method="GET", body=None, timeout=5.0, headers=None):
    """One HTTP request: (status, body bytes, error text). Status 0 and an error when it failed.
    ``headers``: more request headers (e.g. Authorization for an engine started with an API key)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return 0, b"", f"not an http:// URL: {url}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    return _exchange(conn, method, path, body, timeout, headers)


def docker_raw(socket_path, path, timeout=30.0):
    """One GET on the Docker Engine API: (status, body bytes, error text), the body as sent (logs)."""
    status, raw, error = _exchange(UnixHTTPConnection(socket_path, timeout), "GET", path, None, timeout)
    if error:
        return 0, b"", f"cannot reach the Docker engine at unix://{socket_path}: {error}"
    return status, raw, ""


def docker(socket_path, method, path, timeout=10.0, body=None):
    """One Docker Engine API call: (status, parsed JSON or None, error text); ``body``: a JSON request body."""
    status, raw, error = _exchange(UnixHTTPConnection(socket_path, timeout), method, path, body, timeout)
    if error:
        return 0, None, f"cannot reach the Docker engine at unix://{socket_path}: {error}"
    try:
        return status, json.loads(raw.decode() or "null"), ""
    except ValueError:
        return status, None, ""


def answer_text(status, body, error):
    """A Docker call's failure in words: the connection error, else the status and Docker's message."""
    if error:
        return error
    message = body.get("message") if isinstance(body, dict) else None
    return f"Docker API answered HTTP {status}" + (f": {message}" if message else "")


def remove_container(socket_path, name):
    """Remove a container, running or not (one already gone is fine): '' or what went wrong, in words."""
    status, body, error = docker(socket_path, "DELETE", f"/containers/{urllib.parse.quote(name, safe='')}?force=1",
                                 timeout=60)
    return "" if status in (204, 404) else f"cannot remove {name}: {answer_text(status, body, error)}"


def container_gone(socket_path, name):
    """Why the container ``name`` will not answer (exited, dead, crash-looping, removed), else None.

    A crash loop: Docker is restarting it, or has restarted it since it was started (``RestartCount``
    counts restarts since the last start by the API, so a container started by this run begins at 0).
    None also when the engine cannot be asked: then only the check's deadline ends the wait.
    """
    status, body, _error = docker(socket_path, "GET", f"/containers/{urllib.parse.quote(name, safe='')}/json")
    if status == 404:
        return "container does not exist"
    if status != 200 or not isinstance(body, dict):
        return None
    state = body.get("State") or {}
    restarts = body.get("RestartCount") or 0
    if state.get("Restarting") or restarts:
        return (f"container is crash-looping (exit code {state.get('ExitCode')}, restarted {restarts} "
                "time(s) by its restart policy)")
    if state.get("Status") in ("exited", "dead"):
        return f"container {state['Status']} (exit code {state.get('ExitCode')})"
    return None


def lacks_list(raw, key):
    """Why the JSON answer ``raw`` lacks a non-empty list under ``key`` ("" when it has one, or no key asked)."""
    if not key:
        return ""
    try:
        value = json.loads((raw or b"").decode("utf-8", "replace") or "null")
    except ValueError:
        return f"the answer is not JSON, so it has no {key}"
    if not isinstance(value, dict) or not isinstance(value.get(key), list) or not value[key]:
        return f"the answer has no {key}"
    return ""


def _excerpt(raw, limit=500):
    """The start of an answer's body as text, for a message."""
    text = (raw or b"").decode("utf-8", "replace").strip()
    return text[:limit] + ("..." if len(text) > limit else "")


def failed_summary(results):
    """One line naming each check that did not answer, with why (and the start of its answer, if kept);
    "" when every check answered."""
    bad = [r for r in results if not r.get("ok")]
    if not bad:
        return ""
    parts = [f"{r['name']} ({r.get('error') or 'no answer'}{': ' + r['answer'] if r.get('answer') else ''})"
             for r in bad]
    return f"{len(bad)} of {len(results)} did not answer as expected: " + "; ".join(parts)


#: seconds before the second round of a wait: most waits end within seconds (a proxy, a rank that runs
#: already, a stand-in), so the pause starts short and doubles up to the wait's ``interval``
FIRST_INTERVAL_S = 0.25


def pauses(interval, first=FIRST_INTERVAL_S):
    """The pauses between rounds: ``first``, doubling, then ``interval`` for good (never above it)."""
    pause = min(float(interval), float(first))
    while True:
        yield pause
        pause = min(float(interval), pause * 2)


def wait_all(checks, interval, request_timeout=5.0, clock=time.monotonic, sleep=time.sleep, send=request,
             slice_s=0, gone=None, first_interval=FIRST_INTERVAL_S):
    """Poll every check until it answers an expected status or its own deadline passes.

    ``checks``: [{name, url, timeout_s, method (GET), body (None), status ([200]), headers ({}),
    json_list (none)}]. All checks are polled in the same rounds, so a host's ranks are waited for
    together, not one after the other. A check with ``json_list`` (e.g. ``choices``: a request whose
    answer matters, the smoke completion) also needs that key of the JSON answer to be a non-empty
    list, and a failed one carries the start of the ``answer``.
    Returns [{name, url, ok, status, error, attempts, waited_s}] in the order of ``checks``.
    With ``slice_s`` > 0 the wait returns once that many seconds have passed (after a round and its
    interval) even though checks are still within their deadline; those carry ``pending: true`` and
    the caller (the pd_http_wait action plugin, which prints a progress line) waits again for them
    with the time they have left.
    ``gone(container name)`` (e.g. ``container_gone`` on the host's Docker socket), asked after a
    failed probe of a check that names its ``container``, returns why that container will never
    answer; the check then ends at once with that error (``exited: true``) instead of waiting out its
    deadline: a rank whose engine refused its flags fails in seconds, not after its start timeout.
    The pause between rounds starts at ``first_interval`` and doubles up to ``interval`` (``pauses``):
    a check that answers a second after the wait began costs a second, not ``interval``.
    """
    start = clock()
    gaps = pauses(interval, first_interval)
    results = [{"name": c["name"], "url": c["url"], "ok": False, "status": 0, "error": "not probed",
                "attempts": 0, "waited_s": 0.0} for c in checks]
    pending = list(range(len(checks)))
    while pending:
        still = []
        for index in pending:
            check, result = checks[index], results[index]
            remaining = float(check.get("timeout_s", 0)) - (clock() - start)
            # cut a request to its check's time left; an attempt with none left (a single probe, or the
            # last one after the final interval) gets a whole request timeout
            per_request = min(request_timeout, remaining) if remaining > 0 else request_timeout
            # headers only when the check has some: the senders of the tests take four arguments
            extra = {"headers": check["headers"]} if check.get("headers") else {}
            status, raw, error = send(check["url"], check.get("method") or "GET", check.get("body"),
                                      max(0.5, per_request), **extra)
            result.update(status=status, error=error, attempts=result["attempts"] + 1,
                          waited_s=round(clock() - start, 2))
            if status in (check.get("status") or [200]):
                missing = lacks_list(raw, check.get("json_list"))
                if not missing:
                    result.update(ok=True, error="")
                    continue
                # an answer without what the check needs (e.g. a completion without choices)
                error = missing
                result.update(error=error, answer=_excerpt(raw))
            elif raw and check.get("json_list"):
                result["answer"] = _excerpt(raw)
            why = gone(check["container"]) if gone and check.get("container") else None
            if why:
                result.update(error=why, exited=True)
            elif clock() - start < float(check.get("timeout_s", 0)):
                still.append(index)
            elif not error:
                result["error"] = f"HTTP {status}"
        pending = still
        if pending:
            sleep(next(gaps))
            if slice_s and clock() - start >= slice_s:
                for index in pending:
                    results[index]["pending"] = True
                break
    return results
