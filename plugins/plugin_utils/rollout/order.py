# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a rollout rolls and in which order: the clusters a deploy must roll (from what the probe
found), their batches (``pd_cluster_batch``), the waves of ranks inside a cluster, and where each
cluster's deploy lock lives. The plan (``plan.fleet.plan_fleet``) holds the batches it computes."""

from ..shared.errors import PdError
from .containers import (containers_to_start, host_specs, moved_image_warnings, moved_images, orphans, spec_state,
                         start_reason, wiring_differs)


#: The engine roles of a cluster, in the order their serving instances are drained one at a time (a
#: role name of its own; the first wave starts the ranks of every role together).
ENGINE_ROLES = ("decode", "prefill")


def rollout_waves(plan, cluster, role, probes):
    """The order in which a rollout replaces the ``role`` ranks of ``cluster`` (the same on every host).

    ``role`` is "decode", "prefill" or "all" (both: what pd_rollout passes). ``probes`` is {host:
    pd_host_probe result} of the batch. Ranks with nothing to do are left out. Waves, of every role
    together where nothing orders them (docs/design.md, "Rollout waves": decode pulls the KV of each
    request from prefill, the proxy routes only once both answer):

    1. the ranks of instances with nothing serving behind the running proxy (a first deploy, a stopped
       cluster, the proxy not running, new instances) start together, without drain;
    2. each instance serving behind the running proxy while its role has others is a wave of its own:
       taken out of the proxy, drained, replaced, health-checked, put back, one instance at a time, so
       that the role's other instances keep serving (decode instances, then prefill);
    3. the serving ranks of a role that cannot be drained (a single instance: the proxy keeps picking it
       even when isolated; or drain_timeout_s 0) are replaced together last, after every drained wave
       passed: their replacement interrupts the role, and a failed wave before it leaves them serving.

    Without drain waves 1 and 3 are one wave: a version row or image change of a cluster with one
    instance per role replaces its prefill and decode ranks together. Returns [{label, role, names,
    drain: [proxy keys], proxy_host, proxy_url, proxy_name, serving_file, join, timeout_s}] (role: the
    role the wave drains, or the roles of the wave joined with "+"; join: {role: [keys]} the proxy must
    serve before a drain wave drains - every instance of the plan, so the ones wave 1 started are
    added before any serving instance is taken out).
    """
    roles = list(ENGINE_ROLES) if role == "all" else [role]
    summary = plan["clusters"][cluster]
    proxy = summary.get("proxy")
    seen = {h: {c["name"]: c for c in (p or {}).get("containers") or []} for h, p in (probes or {}).items()}
    proxy_up = bool(proxy) and bool((seen.get(proxy["host"], {}).get(proxy["name"]) or {}).get("running"))
    timeout = summary.get("drain_timeout_s") or 0
    fresh, undrained, waves = {}, {}, []
    for one in roles:
        instances = (summary.get("instances") or {}).get(one, [])
        # with one instance nothing else serves the role: the proxy keeps picking it even when isolated,
        # so a drain would only wait for its bound
        drain_on = timeout > 0 and len(instances) > 1
        for inst in instances:
            todo, serving = [], False
            for rank in inst["ranks"]:
                spec = next(s for s in plan["hosts"][rank["host"]]["specs"] if s["name"] == rank["name"])
                found = seen.get(rank["host"], {})
                if containers_to_start([spec], list(found.values())):
                    todo.append(rank["name"])
                serving = serving or bool((found.get(rank["name"]) or {}).get("running"))
            if not todo:
                continue
            if proxy_up and serving and drain_on:
                waves.append({"label": f"{one} instance {inst['instance']}", "role": one, "names": todo,
                              "drain": [r["key"] for r in inst["ranks"]]})
            else:
                (undrained if proxy_up and serving else fresh).setdefault(one, []).extend(todo)

    def together(groups, how):
        return [{"label": f"{' and '.join(groups)} ranks {how}", "role": "+".join(groups),
                 "names": [n for names in groups.values() for n in names], "drain": []}] if groups else []

    if not waves:
        merged = {one: fresh.get(one, []) + undrained.get(one, []) for one in roles if one in fresh or one in undrained}
        out = together(merged, "started together")
    else:
        out = (together(fresh, "started together") + waves
               + together(undrained, "replaced without drain (no other instance serves their role)"))
    for wave in out:
        wave.update(proxy_host=proxy["host"] if proxy else None, timeout_s=timeout,
                    proxy_url=f"http://127.0.0.1:{proxy['ports']['http']}" if proxy else None,
                    proxy_name=proxy["name"] if proxy else None,
                    serving_file=(proxy or {}).get("serving_file") or "",
                    # what the proxy must serve before this wave drains (issue 20 item 4): instances
                    # started by an earlier wave join first, so the role never runs out of instances
                    join=(proxy or {}).get("backends") or {} if wave["drain"] else {})
    return out


_BATCH_FIX = ("write -e pd_cluster_batch=N (N clusters per batch, N >= 1) or P% (P in 1..100, a share of "
              "the clusters to roll, at least one), or leave it out to roll one cluster at a time")


def batch_probes(hosts, probes):
    """{host: {"containers": [...]}} of ``hosts`` (the batch's hosts of one cluster) from ``probes``, the
    pd_host_probe result of each, in the same order: what pd_engine_batch_probes takes (the container
    lists only: the dict is copied to every host of the cluster). A host without a reading has no
    containers listed."""
    where = "pd_batch_probes"
    if not isinstance(hosts, (list, tuple)) or not all(isinstance(h, str) for h in hosts):
        raise PdError(where, "hosts", f"{hosts!r} is not a list of host names",
                      "pass the batch's hosts of the cluster (a list of inventory names)")
    if not isinstance(probes, (list, tuple)) or len(probes) != len(hosts):
        raise PdError(where, "probes", f"expected one pd_host_probe result per host ({len(hosts)}), got "
                      f"{len(probes) if isinstance(probes, (list, tuple)) else type(probes).__name__}",
                      "map the hosts to their registered pd_host_probe results (map('extract', hostvars, name))")
    out = {}
    for host, probe in zip(hosts, probes):
        containers = probe.get("containers") if isinstance(probe, dict) else None
        if containers is not None and not isinstance(containers, list):
            raise PdError(where, f"probes[{host}].containers", f"{type(containers).__name__} is not a list",
                          "pass the pd_host_probe result of each host")
        out[host] = {"containers": list(containers or [])}
    return out


def cluster_batch_size(value, clusters, parallel=False):
    """How many clusters one rollout batch holds: ``pd_cluster_batch`` as the operator wrote it.

    ``value`` is None (unset: one cluster at a time, or every cluster with ``parallel``), a count
    (2, "2") or a percentage of the ``clusters`` to roll ("25%", rounded down, at least 1, as Ansible's
    ``serial`` rounds). Anything else is refused, naming the value and the fix; so is a batch given
    together with pd_parallel_clusters=true (two answers to one question).
    """
    if value is None or value == "":
        return max(clusters, 1) if parallel else 1
    if parallel:
        raise PdError("deploy-pd.yml", "pd_cluster_batch",
                      f"{value!r} is given together with pd_parallel_clusters=true",
                      "give one of them: pd_parallel_clusters=true rolls every cluster at once, the same as "
                      "pd_cluster_batch=100%")
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.endswith("%") and text[:-1].isdigit():
        share = int(text[:-1])
        if 1 <= share <= 100:
            return max(1, clusters * share // 100)
        raise PdError("deploy-pd.yml", "pd_cluster_batch", f"{value!r} is not a share between 1% and 100%", _BATCH_FIX)
    if isinstance(text, str) and text.isdigit():
        text = int(text)
    if isinstance(text, int) and not isinstance(text, bool) and text >= 1:
        return text
    raise PdError("deploy-pd.yml", "pd_cluster_batch",
                  f"{value!r} is neither a number of clusters (1 or more) nor a percentage", _BATCH_FIX)


def cluster_batch_problem(value, parallel=False):
    """The refusal of ``pd_cluster_batch`` as a message ('' when it is fine), for a plain fail task."""
    try:
        cluster_batch_size(value, 1, parallel)
    except PdError as err:
        return str(err)
    return ""


def rollout_batches(play_hosts, hosts, per=1):
    """The play's ``serial`` list: sizes of runs of ``per`` consecutive clusters of ``play_hosts``
    (a cluster's hosts are consecutive in the play), the last batch holding what is left."""
    batches = []
    last = object()
    count = 0
    for name in play_hosts:
        cluster = (hosts.get(name) or {}).get("cluster")
        if cluster == last:
            batches[-1] += 1
            continue
        last = cluster
        if count % per == 0:
            batches.append(1)
        else:
            batches[-1] += 1
        count += 1
    return batches or [1]


def rollout_targets(plan, probes, play_hosts, cluster_batch=None, parallel=False):
    """Which clusters a deploy must roll, from what pd_host_probe found on every host of the play.

    A cluster is rolled when any of its containers (engine ranks, proxy) on a host of the play is not
    running its current launch spec; the others were only probed (health) and are left as they are.
    ``probes`` is {host: pd_host_probe result}. Returns {"hosts": [hosts of the clusters to roll, in
    play order], "batches": the play's serial list for them (``cluster_batch`` clusters per batch, see
    cluster_batch_size; every cluster at once with ``parallel``), "changed": [clusters], "unchanged":
    [clusters], "pending": {host: [container names not running their spec]}, "reasons": {host: {name: why
    it is started or re-wired, in words}}, "removed": {host: [containers of ranks the inventory no
    longer has]}}. A cluster is also rolled when its running proxy lists other instances than the plan
    (re-wired live, not recreated: its spec hash leaves its backends out) or a host runs such a
    container (drained out of the proxy, then removed).

    Also "images": {host: {name: image ID}}: the image a container runs its current spec on, else the one
    its reference names on the host now (what it is started from); "moved": [moved_images of each host,
    with cluster and host] and "warnings": their WARNING lines (a moved tag recreates nothing).
    """
    if not isinstance(probes, dict):
        raise PdError("pd_rollout_targets", "probes", "expected {host: pd_host_probe result}",
                      "pass the registered probe of every play host (roles/pd_prechecks)")
    pending = {}
    reasons = {}
    rewire = []
    removed = {}
    touched = []
    images = {}
    moved = []
    for host in play_hosts:
        entry = plan["hosts"].get(host)
        if entry is None:
            continue
        if entry["cluster"] not in touched:
            touched.append(entry["cluster"])
        probe = probes.get(host)
        if not isinstance(probe, dict) or "containers" not in probe:
            raise PdError("pd_rollout_targets", f"probes.{host}", "this host was not probed",
                          "run roles/pd_prechecks on every host of the play before the rollout")
        todo = containers_to_start(host_specs(entry), probe["containers"])
        refs = probe.get("image_refs") or {}
        images[host] = _image_ids(host_specs(entry), probe["containers"], refs)
        moved.extend(dict(m, cluster=entry["cluster"], host=host)
                     for m in moved_images(host_specs(entry), probe["containers"], refs))
        if todo:
            pending[host] = [s["name"] for s in todo]
            reasons[host] = {s["name"]: start_reason(s, probe["containers"]) for s in todo}
        proxy = entry.get("proxy")
        if proxy and proxy["name"] not in pending.get(host, []) and \
                wiring_differs(proxy, (probe.get("wiring") or {}).get(proxy["name"])):
            rewire.append(entry["cluster"])
            reasons.setdefault(host, {})[proxy["name"]] = "re-wired live: its instances were added or removed"
        dropped = orphans(entry, probe["containers"], host)
        if dropped:
            removed[host] = dropped
    changed = [c for c in touched if any(plan["hosts"][h]["cluster"] == c for h in list(pending) + list(removed))
               or c in rewire]
    hosts = [h for h in play_hosts if h in plan["hosts"] and plan["hosts"][h]["cluster"] in changed]
    per = cluster_batch_size(cluster_batch, len(changed), parallel)
    return {"hosts": hosts, "batches": rollout_batches(hosts, plan["hosts"], per) if hosts else [1],
            "changed": changed, "unchanged": [c for c in touched if c not in changed], "pending": pending,
            "reasons": reasons, "removed": removed, "images": images, "moved": moved,
            "warnings": moved_image_warnings(moved)}


def _image_ids(specs, containers, refs):
    """{name: image ID} of a host's specs: the one a container runs its current spec on, else the one the
    spec's reference names now (left out when neither is known)."""
    found = {c["name"]: c for c in containers}
    out = {}
    for spec in specs:
        running = found[spec["name"]].get("image_id") if spec_state(spec, found) == "current" else None
        image_id = running or (refs.get(spec.get("image")) or {}).get("id")
        if image_id:
            out[spec["name"]] = image_id
    return out


def lock_hosts(plan, play_hosts):
    """[{cluster, host}] for the clusters of ``play_hosts``: each cluster's deploy lock lives on its first
    host in sorted order among all of the cluster's hosts (the same host whatever --limit says)."""
    out = []
    for name in play_hosts:
        entry = plan["hosts"].get(name)
        if entry is None or any(o["cluster"] == entry["cluster"] for o in out):
            continue
        members = sorted(h for h, e in plan["hosts"].items() if e["cluster"] == entry["cluster"])
        out.append({"cluster": entry["cluster"], "host": members[0]})
    return out


def entry_options(specs, passed=None):
    """The options of the ``main`` entry points of several roles' argument specs (each the parsed
    meta/argument_specs.yml), in one dict, without the names in ``passed``: one argument check for a role
    and the roles it runs (roles/pd_rollout) instead of a check task per role and include. A name two
    roles declare differently is a mistake in the roles, not in an inventory: PdError names it."""
    out, skip = {}, set(passed or ())
    for spec in specs:
        options = ((spec or {}).get("argument_specs") or {}).get("main", {}).get("options") or {}
        for name, option in options.items():
            if name in skip:
                continue
            if name in out and out[name] != option:
                raise PdError("meta/argument_specs.yml", name, "declared by two of the roles, differently",
                              "declare the option the same way in each role (or in one)")
            out[name] = option
    return out
