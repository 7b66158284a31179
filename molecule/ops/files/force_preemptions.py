#!/usr/bin/env python3
"""TEST HELPER (molecule/ops): make a stand-in engine's preemption counter grow INSIDE a health check's
window, i.e. between its first and its second GET /metrics.

The health check (playbooks/health_check.yml) scrapes each rank twice, pd_ops_scrape_interval seconds
apart, and calls preemptions critical only when the counter grew between the two scrapes. The stand-in
logs every request it serves (`"GET /metrics HTTP/1.1" 200`), so this helper reads the engine's log
through the Docker Engine API (unix socket), waits for the first scrape after --after, then forces
`vllm:num_preemptions_total` to --value with POST /standin/metrics on 127.0.0.1.

    force_preemptions.py --container NAME --count                 print the scrapes seen so far
    force_preemptions.py --container NAME --after N --url URL --value V [--timeout S]

Prints one JSON object. Exit 1 when no scrape came within --timeout, or when the second scrape had
already happened by the time the value was forced (the window was missed: raise the interval).
Python standard library only.
"""

import argparse
import http.client
import json
import socket
import sys
import time
import urllib.request

SCRAPE = b'"GET /metrics '


class UnixConnection(http.client.HTTPConnection):
    """HTTP over the Docker Engine API's unix socket."""

    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def scrapes(socket_path, container):
    """How many GET /metrics the container's log shows (the stream framing does not split lines)."""
    conn = UnixConnection(socket_path)
    try:
        conn.request("GET", f"/containers/{container}/logs?stdout=1&stderr=1")
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise SystemExit(f"docker logs {container}: HTTP {answer.status} {body[:200]!r}")
    finally:
        conn.close()
    return body.count(SCRAPE)


def force(url, value):
    request = urllib.request.Request(f"{url}/standin/metrics", data=json.dumps({"preemptions": value}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--docker-socket", default="/var/run/docker.sock")
    parser.add_argument("--count", action="store_true", help="only print the scrapes seen so far")
    parser.add_argument("--after", type=int, help="scrapes seen before the health check started")
    parser.add_argument("--url", help="the engine, e.g. http://127.0.0.1:21200")
    parser.add_argument("--value", type=float, default=4)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--poll", type=float, default=0.2)
    args = parser.parse_args(argv)
    if args.count:
        print(json.dumps({"scrapes": scrapes(args.docker_socket, args.container)}))
        return 0
    if args.after is None or not args.url:
        parser.error("--after and --url are needed unless --count")
    deadline = time.monotonic() + args.timeout
    while True:
        seen = scrapes(args.docker_socket, args.container)
        if seen > args.after:
            break
        if time.monotonic() > deadline:
            print(json.dumps({"forced": False, "error": f"no scrape of {args.container} within {args.timeout} s"}))
            return 1
        time.sleep(args.poll)
    forced = force(args.url, args.value)
    after = scrapes(args.docker_socket, args.container)
    result = {"forced": True, "value": args.value, "scrapes_before_force": seen, "scrapes_after_force": after,
              "standin_forced": forced}
    if seen != args.after + 1 or after != args.after + 1:
        result["error"] = "the value was not forced between the first and the second scrape"
        print(json.dumps(result))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
