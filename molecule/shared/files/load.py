#!/usr/bin/env python3
"""TEST LOAD: keep requests on a PD proxy and count the ones that fail.

    load.py URL OUT STOP [--clients N] [--pause-s S] [--max-tokens N] [--limit-s S]

CLIENTS threads each send one completion after the other, PAUSE_S apart, to URL (http://127.0.0.1:<proxy port>)
until the file STOP exists (or LIMIT_S seconds passed), then OUT gets JSON: {ok, failed, seconds,
failures: [{t (s since start), status, error}] (first 50), first_failure_s, last_failure_s}.
A request fails when it does not answer 200 with a non-empty text (the vllm-ascend proxy answers 200
with an empty body when its decode fails after the response started). Standard library only; only
loopback is contacted.
"""

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out")
    p.add_argument("stop")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--limit-s", type=float, default=600)
    args = p.parse_args()
    if not args.url.startswith("http://127.0.0.1:"):
        raise SystemExit("load.py sends requests to 127.0.0.1 only")
    t0 = time.monotonic()
    lock = threading.Lock()
    counts = {"ok": 0, "failed": 0, "failures": []}

    def client():
        while not os.path.exists(args.stop) and time.monotonic() - t0 < args.limit_s:
            status, error = one(args.url, args.max_tokens)
            with lock:
                if error:
                    counts["failed"] += 1
                    if len(counts["failures"]) < 50:
                        counts["failures"].append({"t": round(time.monotonic() - t0, 2), "status": status,
                                                   "error": error})
                else:
                    counts["ok"] += 1
            # a refused connection answers at once: do not spin
            time.sleep(max(args.pause_s, 0.05 if error else 0.0))

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = [f["t"] for f in counts["failures"]]
    counts.update(seconds=round(time.monotonic() - t0, 1), first_failure_s=min(times, default=None),
                  last_failure_s=max(times, default=None))
    with open(args.out + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(counts, fh)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
