#!/usr/bin/python
# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read in one go what pd-deploy needs to know about an Ascend host before touching it."""

DOCUMENTATION = r"""
module: pd_host_probe
short_description: Read an Ascend host's devices, driver, RAM, ports, disk, images and pd-deploy containers
description:
  - One module run per host instead of one task per fact; it only reads and never changes the host.
  - Judging what it read is left to the controller (the pd_host_check action, which runs this module).
  - Containers are those labelled C(label); each one named in O(containers) that runs with the given
    spec hash has its health URL probed.
options:
  docker_socket:
    description: Docker Engine API socket.
    type: path
    default: /var/run/docker.sock
  label:
    description: Label (key=value) of the containers to list.
    type: str
    default: pd.managed-by=pd-deploy
  paths:
    description: Paths to stat (device nodes, driver files, model directory).
    type: list
    elements: str
    default: []
  npu_smi:
    description: Path of npu-smi, run as C(npu-smi info -l) (NPU count) and C(npu-smi info) (chip name and HBM
      per NPU); not run when empty.
    type: str
    default: ""
  hccn:
    description:
      - NPU network checks with hccn_tool, not run when empty. Keys C(tool) (path of hccn_tool), C(conf) (path of
        hccn.conf, read as text), C(devices) (NPU indices; C(-link), C(-net_health), C(-ip) and C(-tls) are read
        for each) and C(ping) (list of C(device), C(address); C(-ping -g address) from that NPU).
      - Judged on the controller (pd_prechecks_decide across a cluster; the pd_hccn_ping_problems filter for the ping).
      - A query that gives no answer (rc not 0, or no output) is asked again, up to 3 tries 1 s apart; a
        ping only when it printed nothing. Each result says how many tries were made.
    type: dict
    default: {}
  compat:
    description:
      - Compatibility readings, not read when empty. Keys C(images) (references whose history, env and labels
        are read from the Engine API, no container started), C(driver_info) (path of the driver's version.info),
        C(daemon_json) (path of Docker's daemon.json); a missing file reads as null.
      - Judged on the controller (pd_host_check).
    type: dict
    default: {}
  host_facts:
    description: Read /proc/meminfo and the listening TCP ports.
    type: bool
    default: false
  disk_path:
    description: Report the free bytes of the filesystem holding this path; not read when empty.
    type: str
    default: ""
  images:
    description: Image references that must be present in the local image store.
    type: list
    elements: str
    default: []
  containers:
    description: Launch specs to compare with what runs (name, hash, health_url, image). The C(image) of each is
      resolved like O(images) and returned in RV(image_refs).
    type: list
    elements: dict
    default: []
  diff_specs:
    description:
      - Launch specs of the host (the plan's, engine ranks and proxy) to compare with what runs, for C(--check --diff).
        Each spec whose container does not run it (absent, stopped, another spec hash), and each labelled container
        of the specs' host and cluster that no spec names (a dropped rank, removed by a deploy), is read with Docker's
        inspect and returned in RV(diff) - image, command (one flag per line), env (secrets as their redaction),
        devices, mounts, shm, network, privileges, restart policy, spec hash and state, before and after.
      - In check mode the task then reports changed (a deploy would change these containers), and Ansible prints the
        differences with C(--diff). Empty (the default) reads nothing more.
    type: list
    elements: dict
    default: []
  probe_timeout:
    description: Seconds to keep probing the health URL of a container that runs its current spec.
    type: float
    default: 10
  probe_interval:
    description: Seconds between two probes of one URL.
    type: float
    default: 2
author: pd-deploy maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the host
  pd.deploy.pd_host_probe:
    paths: [/dev/davinci0, /data/models/DeepSeek-V4-Flash]
    npu_smi: /usr/local/bin/npu-smi
    host_facts: true
    disk_path: /data/models/DeepSeek-V4-Flash
    images: [quay.io/ascend/vllm-ascend:v0.25.1]
    containers:
      - {name: pd-cluster_a-decode0-dp0, hash: 3f2a..., health_url: "http://127.0.0.1:8200/health"}
"""

RETURN = r"""
stats:
  description: Per path, whether it exists, is a directory, is a character device.
  type: dict
  returned: always
npu_smi:
  description: rc, stdout and stderr of C(npu-smi info -l) (rc 127 when it could not run), or null (not asked, or
    not run on a settled host, see RV(skipped_checks)).
  type: dict
  returned: always
npu_smi_info:
  description: rc, stdout and stderr of C(npu-smi info), the status table (rc 127 when it could not run), or null
    (not asked, or not run on a settled host).
  type: dict
  returned: always
meminfo:
  description: Text of /proc/meminfo (empty unless host_facts).
  type: str
  returned: always
listening_ports:
  description: TCP ports in LISTEN state on the host's network namespace (from /proc/net/tcp and tcp6).
  type: list
  returned: always
disk_free_bytes:
  description: Bytes available to unprivileged users on the filesystem of disk_path, or null.
  type: int
  returned: always
docker:
  description: ok (engine answered), msg (why not).
  type: dict
  returned: always
containers:
  description: Every labelled container (name, state, running, hash, cluster, host, baseline, image_id (the
    ID of the image it runs, Docker's C(ImageID)), image_labels (its C(pd.image-id) / C(pd.image-digest) labels)).
  type: list
  returned: always
images_missing:
  description: References of O(images) not in the local image store (empty when Docker did not answer).
  type: list
  returned: always
image_refs:
  description: What each reference of O(images) and of the O(containers) images names in the local image store
    now ({ref -> {id, repo_digests}}); a reference not found is left out (empty when Docker did not answer).
  type: dict
  returned: always
hccn:
  description: With O(hccn), tool_error (why hccn_tool could not run, or empty), conf (hccn.conf text or null),
    devices ({"N" -> {link, net_health, ip, tls} each rc, stdout, stderr, tries}), ping (device, address, rc, stdout,
    stderr, tries), skipped (why no hccn_tool call was made; only hccn.conf was read); null without O(hccn).
  type: dict
  returned: always
skipped_checks:
  description: Why npu-smi, the hccn_tool queries and the compat readings were not made (every container of the
    host runs its launch spec, so this run starts nothing here), else empty. hccn.conf is still read.
  type: str
  returned: always
compat:
  description: With O(compat), images ({ref -> {history (CreatedBy of each layer), env, labels}}), driver_info and
    daemon_json (text or null); null without O(compat).
  type: dict
  returned: always
health:
  description: For each O(containers) entry running its current hash, the probe result (name, url, ok, status, error).
  type: list
  returned: always
diff:
  description: With O(diff_specs), Ansible's diff (before_header, before, after_header, after) of each container a deploy
    would change - before what runs (no container - empty), after its launch spec (removed - empty); secrets redacted.
  type: list
  elements: dict
  returned: when O(diff_specs) finds a container to change
wiring:
  description: For each O(containers) entry with a C(wiring_url) (a PD proxy) running its current hash, the instances
    it serves now ({name -> {prefill, decode}}, or {name -> {error}}), read with an empty C(/instances/add), which
    changes nothing; an instance listed under an alias of a key of the entry's C(backends) reads as that key, one
    whose key is tainted (its C(serving_file) says another key serves) not at all.
  type: dict
  returned: always
"""

import json
import os
import stat as stat_mod
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pd.deploy.plugins.module_utils.pd_drain import listed_instances, load_serving, serving_view, started_at
from ansible_collections.pd.deploy.plugins.module_utils.pd_http import docker, wait_all
from ansible_collections.pd.deploy.plugins.module_utils.pd_launch import container_diff, dropped

LISTEN = "0A"


def stat_paths(paths):
    """{path: {exists, isdir, ischr}}."""
    out = {}
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            out[path] = {"exists": False, "isdir": False, "ischr": False}
            continue
        out[path] = {"exists": True, "isdir": stat_mod.S_ISDIR(mode), "ischr": stat_mod.S_ISCHR(mode)}
    return out


def listening_ports(*tables):
    """Ports in LISTEN state from the text of /proc/net/tcp and /proc/net/tcp6."""
    ports = set()
    for text in tables:
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN and ":" in fields[1]:
                try:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
                except ValueError:
                    continue
    return sorted(ports)


def read_text(path):
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def disk_free(path):
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


#: labels the container role records at start: the image ID and repo digest the spec's tag named then
IMAGE_LABELS = ("pd.image-id", "pd.image-digest")


def list_containers(socket_path, label):
    """(ok, msg, [{name, state, running, hash, ..., image_id, image_labels}]) of every container carrying
    ``label``; ``image_id`` is Docker's ImageID (the image the container runs, whatever its tag names now)."""
    query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [label]})})
    status, body, error = docker(socket_path, "GET", f"/containers/json?{query}")
    if error or status != 200 or not isinstance(body, list):
        return False, error or f"Docker API answered HTTP {status}", []
    out = []
    for item in body:
        labels = item.get("Labels") or {}
        names = item.get("Names") or ["?"]
        out.append({"name": names[0].lstrip("/"), "state": item.get("State", ""),
                    "running": item.get("State") == "running", "hash": labels.get("pd.spec-hash", ""),
                    "cluster": labels.get("pd.cluster", ""), "host": labels.get("pd.host", ""),
                    "baseline": labels.get("pd.baseline") == "true", "image_id": item.get("ImageID") or "",
                    "image_labels": {k: labels[k] for k in IMAGE_LABELS if labels.get(k)}})
    return True, "", sorted(out, key=lambda c: c["name"])


def resolve_images(socket_path, refs):
    """{ref: {id, repo_digests}} of the references found in the local image store (one inspect each)."""
    out = {}
    for ref in dict.fromkeys(refs):
        status, body, error = docker(socket_path, "GET", f"/images/{urllib.parse.quote(ref, safe='/:@')}/json")
        if not error and status == 200 and isinstance(body, dict):
            out[ref] = {"id": body.get("Id") or "", "repo_digests": list(body.get("RepoDigests") or [])}
    return out


def missing_images(socket_path, images, found=None):
    """References of ``images`` not in the local image store (``found``: resolve_images' answer, if read)."""
    found = resolve_images(socket_path, images) if found is None else found
    return [ref for ref in images if ref not in found]


def starting(specs, containers):
    """Names of ``specs`` whose container does not run them now (absent, stopped, another hash)."""
    running = {c["name"]: c["hash"] for c in containers if c["running"]}
    return [s["name"] for s in specs if running.get(s["name"]) != s.get("hash")]


def current_checks(specs, containers, probe_timeout):
    """Health checks of the specs whose container runs their current hash."""
    running = {c["name"]: c["hash"] for c in containers if c["running"]}
    return [{"name": s["name"], "url": s["health_url"], "timeout_s": probe_timeout}
            for s in specs if s.get("health_url") and running.get(s["name"]) == s.get("hash")]


def read_wiring(specs, containers, timeout, docker_socket=""):
    """{name: instances served} of the proxies (specs with a wiring_url) running their current hash: an
    instance listed under an alias of its planned key reads as that key, a tainted key not at all (the
    spec's serving_file tells which key serves)."""
    running = {c["name"]: c["hash"] for c in containers if c["running"]}
    out = {}
    for s in specs:
        if s.get("wiring_url") and running.get(s["name"]) == s.get("hash"):
            listed = listed_instances(s["wiring_url"], timeout)
            serving = load_serving(s["serving_file"], started_at(docker_socket, s["name"])) \
                if s.get("serving_file") else {}
            out[s["name"]] = listed if "error" in listed else serving_view(listed, s.get("backends") or {}, serving)
    return out


def spec_diffs(socket_path, specs, containers):
    """Ansible diff dicts of the containers a deploy would change on this host (O(diff_specs)): the specs not
    running under their name, and the dropped ranks a deploy removes; each read with Docker's inspect."""
    running = {c["name"]: c["hash"] for c in containers if c["running"]}
    images = {}

    def inspect(name):
        status, body, error = docker(socket_path, "GET", f"/containers/{urllib.parse.quote(name, safe='')}/json")
        return body if not error and status == 200 and isinstance(body, dict) else None

    def image_env(found):
        ref = (found or {}).get("Image") or ""
        if ref and ref not in images:
            status, body, error = docker(socket_path, "GET", f"/images/{urllib.parse.quote(ref, safe='/:@')}/json")
            images[ref] = ((body or {}).get("Config") or {}).get("Env") or [] \
                if not error and status == 200 and isinstance(body, dict) else []
        return images.get(ref, [])

    out = []
    for spec in specs:
        if running.get(spec.get("name")) == (spec.get("labels") or {}).get("pd.spec-hash"):
            continue
        found = inspect(spec["name"])
        diff = container_diff(spec["name"], spec, found, image_env(found))
        if diff:
            out.append(diff)
    for name in dropped(specs, containers):
        found = inspect(name)
        if found is not None:
            out.append(container_diff(name, None, found, image_env(found)))
    return [d for d in out if d]


class ToolRunner:
    """Runs the host's tools (npu-smi, hccn_tool) for the probe; what run_npu_smi and run_hccn call.

    Not AnsibleModule.run_command: its read loop ends when select() times out (1 s) and the child has
    exited by the time it polls, without reading what the child wrote in between (ansible/ansible issue
    51393; the loop is unchanged in ansible-core 2.19 module_utils/basic.py). A tool that takes over a
    second and prints its answer as it exits (npu-smi, about a second on a real host, longer on a loaded
    one) then comes back as rc 0 with no output, which the prechecks report as a broken driver ("npu-smi
    info printed no NPU status rows"). subprocess.run reads both pipes to their end.
    """

    @staticmethod
    def run_command(args, handle_exceptions=False):  # noqa: ARG004 (the AnsibleModule signature tests fake)
        proc = subprocess.run([str(a) for a in args], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", check=False)
        return proc.returncode, proc.stdout, proc.stderr


def run_npu_smi(module, path, *args):
    if not path:
        return None
    try:
        rc, out, err = module.run_command([path, "info", *args], handle_exceptions=False)
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}
    return {"rc": rc, "stdout": out, "stderr": err}


def read_optional(path):
    """Text of ``path``, or None when it is not a file."""
    return read_text(path) if path and os.path.isfile(path) else None


def run_compat(socket_path, spec):
    """Image metadata (Engine API, nothing started), driver version.info and daemon.json; None when not asked."""
    if not spec:
        return None
    out = {"images": {}}
    for ref in spec.get("images") or []:
        quoted = urllib.parse.quote(ref, safe="/:@")
        status, body, _error = docker(socket_path, "GET", f"/images/{quoted}/json")
        config = (body or {}).get("Config") or {} if status == 200 and isinstance(body, dict) else {}
        status, hist, _error = docker(socket_path, "GET", f"/images/{quoted}/history")
        layers = hist if status == 200 and isinstance(hist, list) else []
        out["images"][ref] = {"env": config.get("Env") or [], "labels": config.get("Labels") or {},
                              "history": [h.get("CreatedBy", "") for h in layers if isinstance(h, dict)]}
    if "driver_info" in spec:
        out["driver_info"] = read_optional(spec["driver_info"])
    if "daemon_json" in spec:
        out["daemon_json"] = read_optional(spec["daemon_json"])
    return out


HCCN_QUERIES = ("link", "net_health", "ip", "tls")
HCCN_WORKERS = 8
# a loaded host's hccn_tool sometimes answers nothing (rc 0, no output; part of that was run_command losing
# late output, see ToolRunner) or fails once: a query is asked
# again, a bounded number of times, before its answer is judged (issue 20: a precheck failed on one)
HCCN_TRIES = 3
HCCN_RETRY_PAUSE_S = 1.0


def answered(result):
    """An hccn_tool query answered: rc 0 and some output."""
    return result.get("rc") == 0 and bool((result.get("stdout") or "").strip())


def said_something(result):
    """A ping answered (success or its failure, which is the reading): any output at all."""
    return bool((result.get("stdout") or "").strip() or (result.get("stderr") or "").strip())


def ask_again(call, tries=None, pause=None, sleep=time.sleep, done=answered):
    """``call()`` (an hccn_tool run: {rc, stdout, stderr}) until ``done(result)``, at most ``tries`` times
    with ``pause`` seconds between; the last result, with ``tries`` (how many were made)."""
    tries = HCCN_TRIES if tries is None else tries
    pause = HCCN_RETRY_PAUSE_S if pause is None else pause
    for attempt in range(1, max(1, tries) + 1):
        result = call()
        if done(result):
            break
        if attempt < tries:
            sleep(pause)
    return dict(result, tries=attempt)


def run_hccn(module, spec, skip=""):
    """Run the read-only hccn_tool queries of ``spec`` (the O(hccn) option); None when not asked.

    With ``skip`` (why: every rank of the host runs its spec) only hccn.conf is read, the addresses the
    prefill hosts of a rolled cluster ping; no hccn_tool call is made.
    """
    if not spec or not spec.get("tool"):
        return None
    tool = spec["tool"]
    out = {"tool_error": "", "conf": None, "devices": {}, "ping": []}
    conf = spec.get("conf")
    if conf and os.path.isfile(conf):
        out["conf"] = read_text(conf)
    if skip and not spec.get("ping"):
        return dict(out, skipped=skip)
    if not os.access(tool, os.X_OK):
        out["tool_error"] = f"{tool} is missing or not executable"
        return out

    def run_once(args):
        try:
            rc, stdout, stderr = module.run_command([tool, *map(str, args)], handle_exceptions=False)
        except OSError as exc:
            return {"rc": 127, "stdout": "", "stderr": str(exc)}
        return {"rc": rc, "stdout": stdout, "stderr": stderr}

    def run(*args):
        return ask_again(lambda: run_once(args))

    def ping(*args):
        return ask_again(lambda: run_once(args), done=said_something)

    # hccn_tool answers one NPU per call and -ping waits for its replies: run the calls side by side
    devs = [str(d) for d in spec.get("devices") or []]
    pings = list(spec.get("ping") or [])
    with ThreadPoolExecutor(max_workers=HCCN_WORKERS) as pool:
        queries = {(d, q): pool.submit(run, "-i", d, f"-{q}", "-g") for d in devs for q in HCCN_QUERIES}
        pinged = [pool.submit(ping, "-i", t["device"], "-ping", "-g", "address", t["address"]) for t in pings]
        out["devices"] = {d: {q: queries[(d, q)].result() for q in HCCN_QUERIES} for d in devs}
        out["ping"] = [{"device": t["device"], "address": t["address"], **f.result()} for t, f in zip(pings, pinged)]
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
            "label": {"type": "str", "default": "pd.managed-by=pd-deploy"},
            "paths": {"type": "list", "elements": "str", "default": []},
            "npu_smi": {"type": "str", "default": ""},
            "hccn": {"type": "dict", "default": {}},
            "compat": {"type": "dict", "default": {}},
            "host_facts": {"type": "bool", "default": False},
            "disk_path": {"type": "str", "default": ""},
            "images": {"type": "list", "elements": "str", "default": []},
            "containers": {"type": "list", "elements": "dict", "default": []},
            "diff_specs": {"type": "list", "elements": "dict", "default": []},
            "probe_timeout": {"type": "float", "default": 10.0},
            "probe_interval": {"type": "float", "default": 2.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    sock = p["docker_socket"]
    ok, msg, containers = list_containers(sock, p["label"])
    # a host whose every rank runs its launch spec starts nothing in this run: its NPU (npu-smi), NPU
    # network and image/driver checks are for the containers a deploy starts, so they are not run (the
    # no-op path)
    settled = ok and bool(p["containers"]) and not starting(p["containers"], containers)
    skip = "every container of this host runs its launch spec" if settled else ""
    # one inspect per reference, shared by the missing-image check and the moving-tag comparison
    refs = resolve_images(sock, list(p["images"]) + [s["image"] for s in p["containers"] if s.get("image")]) if ok else {}
    # the tools (npu-smi twice, hccn_tool) run in threads while this one asks Docker and the health URLs:
    # each npu-smi call takes about a second on a real host, and they do not depend on each other. On a
    # settled host npu-smi is not run either (its NPU count, chip and HBM are checks of a start; the
    # no-op re-run's slowest reading on a real host)
    smi = "" if settled else p["npu_smi"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        tools = ToolRunner()
        smi_list = pool.submit(run_npu_smi, tools, smi, "-l")
        smi_info = pool.submit(run_npu_smi, tools, smi)
        hccn = pool.submit(run_hccn, tools, p["hccn"], skip)
        compat = run_compat(sock, p["compat"]) if ok and not settled else None
        health = wait_all(current_checks(p["containers"], containers, p["probe_timeout"]), p["probe_interval"])
        wiring = read_wiring(p["containers"], containers, p["probe_timeout"], sock)
        result = {
            "changed": False,
            "stats": stat_paths(p["paths"]),
            "npu_smi": smi_list.result(),
            "npu_smi_info": smi_info.result(),
            "hccn": hccn.result(),
            "compat": compat,
            "skipped_checks": skip,
            "meminfo": read_text("/proc/meminfo") if p["host_facts"] else "",
            "listening_ports": listening_ports(read_text("/proc/net/tcp"), read_text("/proc/net/tcp6"))
            if p["host_facts"] else [],
            "disk_free_bytes": disk_free(p["disk_path"]) if p["disk_path"] else None,
            "docker": {"ok": ok, "msg": msg},
            "containers": containers,
            # without an engine the images cannot be looked up; the Docker message is the one problem
            "images_missing": missing_images(sock, p["images"], refs) if ok else [],
            "image_refs": refs,
            "health": health,
            "wiring": wiring,
        }
    # --check --diff: what a deploy would change here, as Ansible's diff (printed only for a changed result)
    diffs = spec_diffs(sock, p["diff_specs"], containers) if ok and p["diff_specs"] else []
    if diffs:
        result.update(diff=diffs, changed=module.check_mode)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
