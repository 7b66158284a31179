"""A short, fixed completion load through a PD proxy, for playbooks/tune.yml (standard library only).

Sends --requests completions, --concurrency at a time, each with a distinct prompt of about
--prompt-tokens tokens, greedy, --max-tokens tokens generated (ignore_eos, so every request generates
the same amount), streamed so that the time to the first token is measured on the client side.
Prints one JSON object:

    {requests, ok, failed, errors, seconds, completion_tokens, throughput_tokens_per_s,
     requests_per_s, ttft_p50_s, ttft_p95_s, latency_p50_s, latency_p95_s, concurrency, prompt_tokens}

Exit status 0 whenever the load ran (failed requests are counted, the playbook decides); 2 on bad
arguments. With --api-key-file, every request sends ``Authorization: Bearer <the file's key>`` (the
engines answer /v1 without it with 401); the key is read from a file, never taken from argv or an
environment set on a command line, which `ps` shows to every user of the host.
"""

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def percentile(values, q):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[index]


def prompt_for(index, tokens):
    """A distinct prompt of about ``tokens`` tokens (a request number, then repeated short words)."""
    return f"request {index}: " + "tok " * max(1, tokens - 3)


def one_request(url, model, prompt, max_tokens, timeout, api_key=None):
    """Send one streamed completion; return (ttft seconds or None, latency seconds, tokens generated)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    start = time.monotonic()
    ttft = None
    chunks = 0
    usage_tokens = None
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        if "text/event-stream" not in answer.headers.get("Content-Type", ""):
            data = json.loads(answer.read() or b"{}")
            latency = time.monotonic() - start
            usage = data.get("usage") or {}
            return None, latency, usage.get("completion_tokens") or 0
        for raw in answer:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or []:
                text = choice.get("text")
                if text is None:
                    text = (choice.get("delta") or {}).get("content")
                if text:
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - start
    return ttft, time.monotonic() - start, usage_tokens if usage_tokens is not None else chunks


def run(args):
    """Run the load and return the result dict."""
    api_key = None
    if getattr(args, "api_key_file", None):
        with open(args.api_key_file, encoding="utf-8") as handle:
            api_key = handle.read().strip() or None
    lock = threading.Lock()
    next_index = [0]
    ttfts, latencies, errors = [], [], []
    tokens = [0]

    def worker():
        while True:
            with lock:
                index = next_index[0]
                if index >= args.requests:
                    return
                next_index[0] += 1
            try:
                ttft, latency, generated = one_request(args.url, args.model, prompt_for(index, args.prompt_tokens),
                                                       args.max_tokens, args.timeout, api_key)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                with lock:
                    errors.append(f"request {index}: {exc}")
                continue
            with lock:
                latencies.append(latency)
                if ttft is not None:
                    ttfts.append(ttft)
                tokens[0] += generated

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _slot in range(max(1, args.concurrency))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - start
    return {
        "requests": args.requests, "ok": len(latencies), "failed": len(errors), "errors": errors[:5],
        "seconds": seconds, "completion_tokens": tokens[0],
        "throughput_tokens_per_s": tokens[0] / seconds if seconds > 0 else None,
        "requests_per_s": len(latencies) / seconds if seconds > 0 else None,
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p95_s": percentile(ttfts, 0.95),
        "latency_p50_s": percentile(latencies, 0.5), "latency_p95_s": percentile(latencies, 0.95),
        "concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="completions URL, e.g. http://127.0.0.1:8000/v1/completions")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--api-key-file", help="file holding the API key sent as Authorization: Bearer")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1 or args.prompt_tokens < 1:
        parser.error("--requests, --max-tokens and --prompt-tokens must be >= 1")
    json.dump(run(args), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
