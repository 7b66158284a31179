# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Decisions the container roles take on what Docker and the hosts report (plain data in, out)."""

import base64
import binascii
import json
import re
from collections.abc import Mapping

from ..shared.errors import PdError
from ..validate.secrets import secret_env

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def docker_log_text(raw):
    """Text of a Docker Engine API log body: de-framed when multiplexed, decoded as UTF-8.

    Without a TTY the API sends frames ``[stream (1 byte), 0, 0, 0, size (4 bytes, big endian)]`` +
    payload; with a TTY it sends the raw stream. ``raw`` is bytes, or text in which undecodable bytes
    are surrogate-escaped. Undecodable bytes become U+FFFD.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    if not isinstance(raw, (bytes, bytearray)):
        raise PdError("pd_docker_logs", "content", f"{type(raw).__name__} is not a log body",
                      "pass the bytes of GET /containers/<name>/logs or slurp's base64 content")
    data, out, pos = bytes(raw), [], 0
    while pos + 8 <= len(data) and data[pos] in (0, 1, 2) and data[pos + 1:pos + 4] == b"\0\0\0":
        size = int.from_bytes(data[pos + 4:pos + 8], "big")
        out.append(data[pos + 8:pos + 8 + size])
        pos += 8 + size
    body = b"".join(out) + data[pos:] if out else data
    return body.decode("utf-8", "replace")


def clean_log(text):
    """Readable log text: Docker's stream framing and control characters removed."""
    return _CONTROL.sub("", docker_log_text(text or ""))


def log_tail(text, lines=15, indent="    "):
    """The last ``lines`` lines of a container log, cleaned and indented for a failure message."""
    tail = clean_log(text).strip()
    return indent + f"\n{indent}".join(tail.splitlines()[-lines:]) if tail else ""


def docker_logs(slurp_results):
    """``{container name: log text}`` from a ``slurp`` loop over downloaded Docker API log bodies.

    Each result's ``item`` is the ``uri`` download result, whose ``item`` is the launch spec
    (roles/pd_container/tasks/read_logs.yml). Results without content (not read) are left out.
    """
    if not isinstance(slurp_results, (list, tuple)):
        raise PdError("pd_docker_logs", "results", f"{type(slurp_results).__name__} is not a list",
                      "pass the slurp loop's .results")
    out = {}
    for res in slurp_results:
        if not isinstance(res, Mapping) or res.get("content") is None:
            continue
        item = res.get("item") or {}
        spec = item.get("item") if isinstance(item.get("item"), Mapping) else item
        name = spec.get("name")
        if name:
            try:
                body = base64.b64decode(res["content"], validate=True)
            except (binascii.Error, ValueError):
                body = res["content"]
            out[name] = clean_log(body)
    return out


def host_specs(entry):
    """Every launch spec a plan's host entry runs: its engine ranks, then its proxy if it has one."""
    return list(entry["specs"]) + ([entry["proxy"]] if entry.get("proxy") else [])


def _observed(containers, where):
    """{name: container} from the ``containers`` list pd_host_probe returns."""
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) and "name" in c for c in containers):
        raise PdError(where, "containers",
                      "expected the list of containers pd_host_probe reports ({name, state, running, hash})",
                      "pass the .containers of a pd_host_probe result")
    return {c["name"]: c for c in containers}


def spec_state(spec, observed):
    """What runs under a spec's name: current (running this spec), stopped (this spec, not running),
    changed (another spec or a container not ours) or absent."""
    found = observed.get(spec["name"])
    if found is None:
        return "absent"
    if found.get("hash") != spec["labels"]["pd.spec-hash"]:
        return "changed"
    return "current" if found.get("running") else "stopped"


PREVIOUS = "-previous"


def replacement_plan(specs, containers, _where="pd_replacement_plan"):
    """What the container role does for each spec, from what runs on the host: a state machine that
    also finishes or rolls back a replacement an earlier run left half done.

    A replacement keeps the old container, stopped, as ``<name>-previous`` until the new one answers
    its health URL. Per spec, with S = the container under its name and P = ``<name>-previous``:

    - no P: S runs the spec -> nothing; S absent or not running (exited, created, restarting: a crash
      loop is not running) with the spec -> start; S with another spec (or not ours) -> keep S as P
      (``preserve``), then start.
    - P left by an earlier run: S runs the spec -> ``finish`` (health wait; healthy -> P removed, else
      rolled back to P); S runs another spec -> P is stale, S is kept as the new P as above; S absent
      or not running -> the earlier run stopped between the rename and a healthy S (``interrupted``):
      S is removed if present (``remove``), started afresh, and P is the rollback target.

    Returns {start: [specs passed to docker_container], wait: [specs health-waited: start + finish],
    preserve: [names stopped and renamed to P], remove: [names whose S is removed first],
    previous: [names with a P after this step: the rollback targets, removed once healthy],
    finish: [names], interrupted: [names], created: [names of the start specs that get a new container:
    S absent, of another spec, or removed first; not a stopped S of the same spec, which is started as
    it is, with the filesystem and command line of its creation]}.
    """
    observed = _observed(containers, _where)
    plan = {k: [] for k in ("start", "wait", "preserve", "remove", "previous", "finish", "interrupted", "created")}
    for spec in specs:
        name = spec["name"]
        state = spec_state(spec, observed)
        kept = observed.get(name + PREVIOUS)
        current = observed.get(name)
        running = bool(current and current.get("running"))
        if kept is not None and state == "current":
            plan["finish"].append(name)
            plan["previous"].append(name)
            plan["wait"].append(spec)
            continue
        if state == "current":
            continue
        if kept is not None and not running:
            plan["interrupted"].append(name)
            if current is not None:
                plan["remove"].append(name)
            plan["previous"].append(name)
        elif state == "changed":
            plan["preserve"].append(name)
            plan["previous"].append(name)
        if state != "stopped" or name in plan["remove"]:
            plan["created"].append(name)
        plan["start"].append(spec)
        plan["wait"].append(spec)
    return plan


def start_reason(spec, containers):
    """Why a deploy starts a spec, in words for the summary (None: it runs its spec and needs nothing),
    from the same decision as the container role's (replacement_plan)."""
    plan = replacement_plan([spec], containers, "pd_start_reason")
    if spec["name"] in plan["finish"]:
        return "an interrupted replacement, finished"
    if spec["name"] in plan["interrupted"]:
        return "an interrupted replacement, started afresh"
    if not plan["start"]:
        return None
    return {"absent": "started: it did not exist", "changed": "recreated: its launch spec changed",
            "stopped": "restarted: it was not running (same launch spec)"}[
        spec_state(spec, _observed(containers, "pd_start_reason"))]


def containers_to_start(specs, containers):
    """Specs that need work on this host: not running their spec, or a replacement left half done."""
    plan = replacement_plan(specs, containers, "pd_containers_to_start")
    todo = {s["name"] for s in plan["wait"]}
    return [s for s in specs if s["name"] in todo]


def running_previous(containers):
    """Kept previous containers that run (a restart policy or a daemon restart started them)."""
    return [c["name"] for c in _observed(containers, "pd_running_previous").values()
            if c["name"].endswith(PREVIOUS) and c.get("state") in ("running", "restarting")]


def probe_specs(specs):
    """The health-relevant part of launch specs, as pd_host_probe takes them (a proxy's also the URL
    its instance lists are read from), with the image reference the probe resolves."""
    return [dict({"name": s["name"], "hash": s["labels"]["pd.spec-hash"], "health_url": s.get("health_url") or "",
                  "image": s.get("image") or ""},
                 **({"wiring_url": f"http://127.0.0.1:{s['ports']['http']}", "backends": s.get("backends") or {},
                     "serving_file": s.get("serving_file") or ""} if s.get("kind") == "proxy" else {}))
            for s in specs]


#: the container labels that record the image a container was started from (not in the spec hash:
#: they are added at start, so an unchanged inventory keeps its hash and nothing is recreated)
IMAGE_ID_LABEL = "pd.image-id"
IMAGE_DIGEST_LABEL = "pd.image-digest"


def pinned_image(ref):
    """Whether an image reference names one image for good: a digest (``repo@sha256:...``) or an image
    ID (``sha256:...``). A tag (``repo:nightly-main``, ``repo``) can be moved to another image."""
    text = str(ref or "")
    return "@sha256:" in text or text.startswith("sha256:")


def short_id(image_id):
    """An image ID as ``docker images`` shows it: 12 hex digits, without ``sha256:``."""
    text = str(image_id or "")
    return text.split(":", 1)[1][:12] if text.startswith("sha256:") else text[:12]


def _repository(ref):
    """``quay.io/ascend/vllm-ascend`` of ``quay.io/ascend/vllm-ascend:v1`` (a registry port is not a tag)."""
    name = str(ref).split("@", 1)[0]
    head, _sep, tag = name.rpartition(":")
    return head if head and "/" not in tag else name


def repo_digest(ref, found):
    """The ``repo@sha256:...`` of the image ``ref`` names (``found`` is pd_host_probe's image_refs entry for
    it), in the repository of ``ref`` when the image has one there; "" when it has none (an image loaded
    with docker load, or built on the host, has no repo digest)."""
    digests = list((found or {}).get("repo_digests") or [])
    mine = [d for d in digests if d.split("@", 1)[0] == _repository(ref)]
    return (mine or digests or [""])[0]


def start_labels(spec, images, containers=None):
    """The labels a launch spec's container is started with: the spec's own, plus ``pd.image-id`` (and
    ``pd.image-digest`` when the image has one) of the image its reference names on the host now
    (``images``: pd_host_probe's image_refs, read just before the start).

    A stopped container of the same spec (``containers``: the probe's list) is started as it is: it keeps
    the image labels it carries (docker_container compares labels strictly, so new ones would recreate
    it on whatever the tag names now); not when it is the new container of an interrupted replacement
    (beside ``<name>-previous``), which replacement_plan removes and starts afresh. A reference the probe
    did not resolve adds no image label.
    """
    if not isinstance(spec, Mapping) or not isinstance(spec.get("labels"), Mapping):
        raise PdError("pd_start_requests", "spec", "expected a launch spec with labels", "pass a plan's launch spec")
    labels = dict(spec["labels"])
    observed = _observed(containers or [], "pd_start_requests")
    if spec_state(spec, observed) == "stopped" and spec["name"] + PREVIOUS not in observed:
        labels.update(observed[spec["name"]].get("image_labels") or {})
        return labels
    found = (images or {}).get(spec.get("image")) if isinstance(images, Mapping) else None
    if found and found.get("id"):
        labels[IMAGE_ID_LABEL] = found["id"]
        digest = repo_digest(spec["image"], found)
        if digest:
            labels[IMAGE_DIGEST_LABEL] = digest
    return labels


def start_image(image, pulled=None):
    """The reference a container of ``image`` is started from: ``repo@sha256:...`` of the image a pull step
    fetched for ``image`` on this host (``pulled``: {ref: {id, repo_digests}}, role pd_image's
    C(pd_image_pulled)), so that the container runs exactly what was pulled even if the tag moves between
    the pull and the start; its image ID when the pulled image has no repo digest; ``image`` itself when
    nothing was pulled for it (the image came with playbooks/images.yml, or pd_image_pull is never).
    """
    if not isinstance(image, str) or not image:
        raise PdError("pd_start_requests", "image", f"expected an image reference, got {image!r}",
                      "pass a launch spec's image")
    if pulled is not None and not isinstance(pulled, Mapping):
        raise PdError("pd_start_requests", "pulled", f"expected {{ref: {{id, repo_digests}}}}, got {type(pulled).__name__}",
                      "pass pd_image_pulled (role pd_image) or {}")
    found = (pulled or {}).get(image)
    if not isinstance(found, Mapping) or not found.get("id"):
        return image
    mine = [d for d in (found.get("repo_digests") or []) if d.split("@", 1)[0] == _repository(image)]
    return mine[0] if mine else found["id"]


def start_requests(specs, images, pulled=None, containers=None, api_key=None):
    """What module pd_container_start is given for the launch specs to start: each spec's name, command,
    devices, volumes, shm size, network mode, privileged and restart policy as planned, started from
    start_image (the digest a pull step fetched), with secret_env (the real API key, only here) and
    start_labels (``images``: the image labels' reading, {} when a pull may change the image)."""
    if not isinstance(specs, (list, tuple)):
        raise PdError("pd_start_requests", "specs", f"expected a list of launch specs, got {type(specs).__name__}",
                      "pass pd_container_plan.start")
    keys = ("name", "command", "devices", "volumes", "shm_size_bytes", "network_mode", "privileged", "restart_policy")
    out = []
    for spec in specs:
        if not isinstance(spec, Mapping) or not spec.get("name") or not spec.get("image"):
            raise PdError("pd_start_requests", "specs", f"expected launch specs with a name and an image, got {spec!r:.80}",
                          "pass pd_container_plan.start")
        request = {key: spec.get(key) for key in keys}
        request.update(image=start_image(spec["image"], pulled), env=secret_env(spec, api_key),
                       labels=start_labels(spec, images, containers))
        out.append(request)
    return out


def moved_images(specs, containers, images):
    """Containers that run their current launch spec on another image than the one its tag names now.

    ``containers`` and ``images`` are pd_host_probe's containers and image_refs. Such a container is not
    recreated (its spec is unchanged): the deploy only warns. A pinned reference (digest, image ID), a
    container whose image ID is not known and a tag that names no image on the host are not moved.
    Returns [{name, image, running, now, running_digest, digest}] (image IDs in full).
    """
    observed = _observed(containers, "pd_moved_images")
    images = images if isinstance(images, Mapping) else {}
    out = []
    for spec in specs:
        ref = spec.get("image") or ""
        if pinned_image(ref) or spec_state(spec, observed) != "current":
            continue
        found = observed[spec["name"]]
        running, now = found.get("image_id") or "", (images.get(ref) or {}).get("id") or ""
        if running and now and running != now:
            out.append({"name": spec["name"], "image": ref, "running": running, "now": now,
                        "running_digest": (found.get("image_labels") or {}).get(IMAGE_DIGEST_LABEL, ""),
                        "digest": repo_digest(ref, images.get(ref))})
    return out


def moved_image_warnings(moves):
    """One WARNING per cluster, tag and image pair for the moved_images of a deploy (``moves``: each with
    its ``cluster`` and ``host``), saying what runs, what the tag names now, and how to move or stay."""
    groups = {}
    for m in moves or []:
        key = (m["cluster"], m["image"], m["running"], m["now"])
        groups.setdefault(key, []).append(m)
    out = []
    for (cluster, ref, running, now), group in groups.items():
        names = ", ".join(f"{m['name']} on {m['host']}" for m in group)
        new = next((m["digest"] for m in group if m["digest"]), "")
        old = next((m["running_digest"] for m in group if m["running_digest"]), "")
        hosts = "the host" if len({m["host"] for m in group}) == 1 else "those hosts"
        # without a repo digest (loaded with docker load, or built on the host) the image ID pins it: an
        # image's ID is the digest of its config, the same on every host that loaded it
        move = f"set pd_cluster.image to {new or now}"
        stay = f"set it to {old or running}"
        one = len(group) == 1
        verb, they, them = ("runs", "it", "it") if one else ("run", "they", "them")
        out.append(f"WARNING {cluster}: {names} {verb} image {short_id(running)}, but its tag {ref} now names "
                   f"image {short_id(now)} on {hosts} (the tag moved after {they} started). Nothing was recreated: "
                   f"the launch spec is unchanged. To run the new image, {move}: the launch spec changes, so the "
                   f"deploy replaces {them}, health-gated with rollback. To stay on the running image, {stay}.")
    return out


def wiring_differs(proxy, wiring):
    """Whether a running proxy serves other instances than its spec's backends (``wiring`` is
    pd_host_probe's reading for it, where an alias of a planned instance reads as the planned key and
    a tainted one not at all; None or an error: not known, so no)."""
    if not proxy or not isinstance(wiring, Mapping) or "error" in wiring:
        return False
    want = proxy.get("backends") or {}
    return any(sorted(wiring.get(role) or []) != sorted(want.get(role) or []) for role in ("prefill", "decode"))


def orphans(entry, containers, host):
    """Containers of ``host`` (its ``pd.host`` label) and of this host's cluster that no launch spec of
    the plan names any more (ranks of instances the inventory dropped), without kept previous
    containers and baseline engines (playbooks/baseline.yml). A container without the label (made
    by an older pd-deploy) is never taken for one."""
    names = {s["name"] for s in host_specs(entry)}
    return [c["name"] for c in _observed(containers, "pd_orphans").values()
            if c.get("cluster") == entry["cluster"] and c.get("host") == host and c["name"] not in names
            and not c["name"].endswith(PREVIOUS) and not c.get("baseline")]


def health_checks(specs, previous=None):
    """pd_http_wait checks for launch specs: each health URL within the spec's own start timeout.

    Each check names its container, so the wait ends at once for a rank whose container exited. A spec
    named in ``previous`` (pd_replacement_plan's previous) also names its ``<name>-previous``, which the
    wait removes once the rank answered (``retire``).
    """
    previous = set(previous or [])
    return [dict({"name": s["name"], "url": s["health_url"], "timeout_s": s.get("health_timeout_s") or 0,
                  "container": s["name"]}, **({"retire": s["name"] + PREVIOUS} if s["name"] in previous else {}))
            for s in specs if s.get("health_url")]


def unhealthy_specs(wait_result, specs):
    """Specs whose check in a pd_http_wait result did not end healthy (skipped waits count as healthy).

    Each comes back with ``health_wait``: how its wait ended (error, waited_s, exited), for the
    failure message.
    """
    results = (wait_result or {}).get("results")
    if (wait_result or {}).get("skipped") or results is None:
        return []
    failed = {r["name"]: r for r in results if not r.get("ok")}
    return [dict(s, health_wait={k: failed[s["name"]].get(k) for k in ("error", "waited_s", "exited")})
            for s in specs if s["name"] in failed]


def sick_current(specs, probe):
    """Messages for containers running their current spec that did not answer the probe."""
    results = {r["name"]: r for r in (probe or {}).get("health") or []}
    out = []
    for spec in specs:
        res = results.get(spec["name"])
        if res is not None and not res.get("ok"):
            why = f"HTTP {res['status']}" if res.get("status") else (res.get("error") or "no answer")
            out.append(f"{spec['name']} runs its current launch spec but {spec['health_url']} does not answer "
                       f"({why}) — nothing was restarted; if it is still loading (restarted by Docker), re-run "
                       "once it answers; otherwise read its log (playbooks/collect_logs.yml), fix the cause, "
                       "and remove the container to let the next run recreate it")
    return out


def wait_outcome(spec):
    """How a rank's health wait ended: ``exited after 12 s: container exited (exit code 2)`` or
    ``no answer within 1800 s (HTTP 503)``."""
    wait = spec.get("health_wait") or {}
    if wait.get("exited"):
        return f"stopped waiting after {wait.get('waited_s')} s: {wait.get('error')}"
    last = f" (last: {wait['error']})" if wait.get("error") else ""
    return f"no answer within {spec.get('health_timeout_s')} s{last}"


def rollback_message(unhealthy, logs, replaced, host, restored_unhealthy=None):
    """One readable failure message: which containers failed, what was restored, log tails.

    ``logs`` is ``{container name: log text}`` (pd_docker_logs); ``restored_unhealthy`` names the
    restored previous containers that did not answer their health URL either.
    """
    logs = logs or {}
    lines = [f"{host}: {len(unhealthy)} container(s) never answered their health URL; "
             "this host is failed and the rollout stops here."]
    for spec in unhealthy:
        name = spec["name"]
        if name not in (replaced or []):
            state = "no previous container existed; nothing is serving this rank now"
        elif name in (restored_unhealthy or []):
            state = "previous container restored and started, but it does not answer its health URL either"
        else:
            state = "previous container restored and healthy"
        lines.append(f"- {name} ({spec['health_url']}, {wait_outcome(spec)}): {state}.")
        tail = log_tail(logs.get(name))
        if tail:
            lines.append("  last log lines:\n" + tail)
    lines.append("Fix the launch spec (playbooks/deploy_pd.yml -e pd_render_only=true shows it), "
                 "or run playbooks/collect_logs.yml for the full logs, then re-run the deploy.")
    return "\n".join(lines)


def spec_ports(spec):
    """Every TCP port a launch spec listens on: HTTP, DP RPC (rank 0) and the Mooncake range."""
    ports = spec.get("ports") or {}
    out = [ports["http"]] if "http" in ports else []
    if "dp_rpc" in ports and spec.get("dp_rank") == 0:
        out.append(ports["dp_rpc"])
    if "kv" in ports:
        low, high = ports["kv"]
        out.extend(range(low, high))  # [kv_port, kv_port + dp*tp): the next instance starts at the end
    return out


def port_conflicts(specs, in_use, own_running):
    """Precheck messages for ports of ``specs`` already taken by something not ours."""
    taken = set(in_use or [])
    mine = set(own_running or [])
    out = []
    for spec in specs:
        if spec["name"] in mine:
            continue
        busy = sorted(p for p in spec_ports(spec) if p in taken)
        if busy:
            out.append(f"ports {', '.join(map(str, busy))} needed by {spec['name']} are already in use — "
                       "stop what listens there or change port_base / kv_port / dp_rpc_port / proxy.port")
    return out


def wiring_message(result, host, proxy):
    """The failure text of a proxy that could not be wired to its cluster's instances (pd_proxy_drain
    state=wired): the proxy down (``proxy_down``) is named as such; else the instances it did not take."""
    result = result or {}
    if result.get("proxy_down"):
        return (f"{host}: the proxy {proxy} is down ({result['proxy_down']}): the cluster serves no request "
                "through it. The new ranks are not at fault. Deploy again: the next deploy starts the proxy "
                "(it does not run its launch spec) with every instance on its command line; if it stops again, "
                f"read its log (docker logs {proxy} on {host}).")
    missing = sorted({k for r in (result.get("restores") or {}).values() for k in (r or {}).get("missing") or []})
    return (f"{host}: the proxy {proxy} could not be wired to the cluster's instances "
            f"({result.get('error') or 'bound reached'}; added {json.dumps(result.get('added') or {})}, removed "
            f"{json.dumps(result.get('removed') or {})}, still missing {json.dumps(missing)}). Check that the new ranks "
            "answer /v1/models, then deploy again.")
