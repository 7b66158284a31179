#!/usr/bin/env python3
"""TEST LOAD: keep requests in flight on a PD proxy without a gap, and count what failed and who served.

    load.py URL OUT STOP [--clients N] [--pause-s S] [--max-tokens N] [--spread-tokens N] [--limit-s S]
                         [--sample-s S] [--backend HOST:PORT ...] [--settle-s S]

CLIENTS threads each send one completion after the other (PAUSE_S apart, 0 by default) to URL
(http://127.0.0.1:<proxy port>). Client i starts i/N of a generation after the first, and each request
asks for MAX_TOKENS +/- SPREAD_TOKENS tokens (a fixed pseudo-random sequence per client), so the
generations overlap and their ends drift apart: with N >= 2 some request is in flight at every moment,
which keeps vllm-ascend's proxy from ever being idle (its request_num > 0).

When the file STOP appears (the change under test has ended), the load goes on until every BACKEND
(an engine's port on 127.0.0.1: its `vllm:generation_tokens_total` on /metrics) has served tokens
after that moment, at most SETTLE_S seconds, then stops; LIMIT_S bounds the whole run. OUT gets JSON:

  ok, failed, seconds, failures [{t, status, error}] (first 50), first_failure_s, last_failure_s
  gaps                 moments a request ended while no other was in flight (client side, exact;
                       counted from the moment every client runs until the load stops)
  min_in_flight        fewest other requests in flight when one ended (same window)
  proxy_samples, proxy_min_request_num, proxy_idle_samples
                       the proxy's GET /healthcheck request_num sampled every SAMPLE_S s in that window
                       (proxy_min_request_num is null when the proxy never answered one)
  served               {backend: tokens it generated during the run} (engine restarts counted)
  served_after_stop    {backend: tokens it generated after STOP appeared}
  unserved_after_stop  backends that generated nothing after STOP within SETTLE_S
  settle_s             how long the load ran after STOP

A request fails when it does not answer 200 with a non-empty text (the vllm-ascend proxy answers 200
with an empty body when its decode fails after the response started). Standard library only; only
loopback is contacted.
"""

import argparse
import json
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request

TOKENS_RE = re.compile(r"^vllm:generation_tokens_total\{[^}]*\}\s+([0-9.eE+-]+)\s*$", re.M)


def one(url, max_tokens):
    body = json.dumps({"model": "deepseek-v4-flash", "prompt": "load", "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:200].decode("utf-8", "replace")
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        text = json.loads(raw)["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return status, f"no completion text in {raw[:200]!r}"
    return (status, "") if status == 200 and text else (status, "empty text")


def get_text(url):
    """Body of a GET on loopback, or None when nothing answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode("utf-8", "replace") if resp.status == 200 else None
    except (OSError, ValueError):
        return None


def generated_tokens(backend):
    """An engine's vllm:generation_tokens_total (summed over its samples), or None when it does not answer."""
    text = get_text(f"http://{backend}/metrics")
    if text is None:
        return None
    return sum(float(v) for v in TOKENS_RE.findall(text))


class Counter:
    """Tokens a backend generated, across restarts (a counter that drops started again from 0)."""

    def __init__(self):
        self.last = None
        self.total = 0.0

    def read(self, value):
        if value is None:
            return
        if self.last is not None:
            self.total += value - self.last if value >= self.last else value
        self.last = value


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out")
    p.add_argument("stop")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--spread-tokens", type=int, default=0)
    p.add_argument("--token-s", type=float, default=0.05, help="the engines' time per token (stagger only)")
    p.add_argument("--limit-s", type=float, default=600)
    p.add_argument("--sample-s", type=float, default=0.1)
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--settle-s", type=float, default=0.0)
    args = p.parse_args()
    if not args.url.startswith("http://127.0.0.1:") or any(
            not re.fullmatch(r"127\.0\.0\.1:\d+", b) for b in args.backend):
        raise SystemExit("load.py sends requests to 127.0.0.1 only")
    if args.spread_tokens >= args.max_tokens:
        raise SystemExit("--spread-tokens must be below --max-tokens")
    t0 = time.monotonic()
    lock = threading.Lock()
    counts = {"ok": 0, "failed": 0, "failures": [], "gaps": 0, "min_in_flight": None}
    state = {"in_flight": 0, "started": 0}
    watching = threading.Event()  # every client runs, the load has not begun to stop
    done = threading.Event()      # clients stop
    stopped_at = {}

    def timed_out():
        return time.monotonic() - t0 >= args.limit_s

    def client(index):
        rng = random.Random(index)
        time.sleep(index * args.max_tokens * args.token_s / max(1, args.clients))
        with lock:
            state["started"] += 1
            if state["started"] == args.clients:
                watching.set()
        while not done.is_set() and not timed_out():
            tokens = args.max_tokens + rng.randint(-args.spread_tokens, args.spread_tokens)
            with lock:
                state["in_flight"] += 1
            status, error = one(args.url, tokens)
            with lock:
                state["in_flight"] -= 1
                if watching.is_set():
                    others = state["in_flight"]
                    if counts["min_in_flight"] is None or others < counts["min_in_flight"]:
                        counts["min_in_flight"] = others
                    if others == 0:
                        counts["gaps"] += 1
                if error:
                    counts["failed"] += 1
                    if len(counts["failures"]) < 50:
                        counts["failures"].append({"t": round(time.monotonic() - t0, 2), "status": status,
                                                   "error": error})
                else:
                    counts["ok"] += 1
            # a refused connection answers at once: do not spin
            time.sleep(max(args.pause_s, 0.05 if error else 0.0))

    proxy = {"samples": 0, "min": None, "idle": 0}
    served = {b: Counter() for b in args.backend}
    served_lock = threading.Lock()
    after = {}

    def read_backends():
        with served_lock:
            for b, c in served.items():
                c.read(generated_tokens(b))

    def sampler():
        next_metrics = 0.0
        while not done.is_set() and not timed_out():
            if watching.is_set():
                text = get_text(args.url + "/healthcheck")
                try:
                    num = json.loads(text)["request_num"] if text else None
                except (ValueError, KeyError, TypeError):
                    num = None
                if num is not None and watching.is_set():
                    proxy["samples"] += 1
                    proxy["min"] = num if proxy["min"] is None else min(proxy["min"], num)
                    proxy["idle"] += num == 0
            if time.monotonic() >= next_metrics:
                read_backends()
                next_metrics = time.monotonic() + 0.5
            time.sleep(args.sample_s)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    while not os.path.exists(args.stop) and not timed_out():
        time.sleep(0.1)
    stopped_at["t"] = time.monotonic()
    read_backends()
    with served_lock:
        after.update({b: c.total for b, c in served.items()})
    # go on until every backend served after the change, within the settle bound
    while args.backend and time.monotonic() - stopped_at["t"] < args.settle_s and not timed_out():
        read_backends()
        if all(served[b].total > after[b] for b in args.backend):
            break
        time.sleep(0.2)
    watching.clear()
    done.set()
    for t in threads:
        t.join()
    read_backends()
    times = [f["t"] for f in counts["failures"]]
    counts.update(
        seconds=round(time.monotonic() - t0, 1), first_failure_s=min(times, default=None),
        last_failure_s=max(times, default=None), proxy_samples=proxy["samples"],
        proxy_min_request_num=proxy["min"], proxy_idle_samples=proxy["idle"],
        served={b: c.total for b, c in served.items()},
        served_after_stop={b: served[b].total - after[b] for b in args.backend},
        unserved_after_stop=[b for b in args.backend if served[b].total <= after[b]],
        settle_s=round(time.monotonic() - stopped_at["t"], 1))
    with open(args.out + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(counts, fh)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
