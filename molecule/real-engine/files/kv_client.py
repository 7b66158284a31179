#!/usr/bin/env python3
"""TEST CLIENT (molecule/real-engine): one request that moves its prompt's KV from P to D the way vLLM's
own MooncakeConnector is driven (vLLM v0.27.1, vllm/distributed/kv_transfer/kv_connector/v1/mooncake/
mooncake_connector.py). vllm-ascend's proxy cannot drive it: it sends remote_host/remote_port, while
vLLM's connector wants a caller-made transfer_id and P's bootstrap address.

  1. GET <bootstrap>/query: P's bootstrap server (MooncakeBootstrapServer, VLLM_MOONCAKE_BOOTSTRAP_PORT)
     lists P's engine_id by DP rank.
  2. P: the prompt with max_tokens 1 and kv_transfer_params {do_remote_decode: true, transfer_id}
     (update_state_after_alloc / request_finished: P keeps the blocks for D, answers no params).
  3. D: the same prompt with {do_remote_prefill: true, transfer_id, remote_engine_id,
     remote_bootstrap_addr} (get_num_new_matched_tokens: all prompt tokens come from P).

Standard library only; talks to 127.0.0.1 only. Prints one JSON object: the transfer's ids, P's and
D's answers (text, token ids, usage).
"""

import argparse
import json
import sys
import urllib.parse
import urllib.request
import uuid


def _local(url):
    host = urllib.parse.urlsplit(url).hostname
    if host != "127.0.0.1":
        sys.exit(f"kv_client: {url}: only 127.0.0.1 is allowed")
    return url.rstrip("/")


def _call(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", required=True, help="P's base URL, http://127.0.0.1:PORT")
    ap.add_argument("--decode", required=True, help="D's base URL")
    ap.add_argument("--bootstrap", required=True, help="P's Mooncake bootstrap server, http://127.0.0.1:PORT")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args(argv)
    prefill, decode, bootstrap = _local(args.prefill), _local(args.decode), _local(args.bootstrap)

    engines = _call(bootstrap + "/query", timeout=args.timeout)
    if not engines:
        sys.exit(f"kv_client: {bootstrap}/query lists no prefill engine: {engines}")
    remote_engine_id = engines[sorted(engines)[0]]["engine_id"]
    transfer_id = f"pd-test-{uuid.uuid4().hex}"
    common = {"model": args.model, "prompt": args.prompt, "temperature": 0, "return_token_ids": True}

    p = _call(prefill + "/v1/completions", dict(common, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}), args.timeout)
    d = _call(decode + "/v1/completions", dict(common, max_tokens=args.max_tokens, kv_transfer_params={
        "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": transfer_id,
        "remote_engine_id": remote_engine_id, "remote_bootstrap_addr": bootstrap}), args.timeout)

    def answer(r):
        c = r["choices"][0]
        return {"text": c["text"], "token_ids": c.get("token_ids"), "prompt_token_ids": c.get("prompt_token_ids"),
                "usage": r["usage"], "kv_transfer_params": r.get("kv_transfer_params")}

    json.dump({"transfer_id": transfer_id, "remote_engine_id": remote_engine_id, "bootstrap": engines,
               "prefill": answer(p), "decode": answer(d)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
