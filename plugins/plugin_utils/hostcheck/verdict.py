# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The prechecks' judgement in Python, for the two controller steps of roles/pd_prechecks (issue 24):

- ``probe_request`` and ``host_judgement``: what pd_host_probe reads on one host, and that host's own
  problems and Docker warnings from what it read (the pd_host_check action, one task per host);
- ``fleet_verdict``: every host's verdict, the problems only the whole play shows (the NPU network across
  a cluster, a --tags selection that would leave a cluster half deployed), and, when nothing is wrong, the
  rollout and the NPU ping targets (the pd_prechecks_decide action, once per run).

They were Jinja expressions of two tasks (the probe's arguments, then a check task per host that computed
the host's problems twice, in its message and in its condition); ansible-core compiles every template on
every use in every worker, so the same judgement in Python costs a fraction. The rules are the functions
those tasks' filters applied (prechecks.problems, compat.problems and docker_warnings, netchecks
cluster_problems and ping_targets, selection.tag_problems, order.rollout_targets), called here, not copied.
"""

from ansible_collections.pd.deploy.plugins.plugin_utils.hostcheck import compat, netchecks, prechecks
from ansible_collections.pd.deploy.plugins.plugin_utils.rollout import containers, order, selection
from ansible_collections.pd.deploy.plugins.plugin_utils.shared import sizes


def hccn_tool(root):
    """hccn_tool's path under the host's Ascend root ('' on a real host)."""
    return f"{root}/usr/local/Ascend/driver/tools/hccn_tool"


def probe_request(host_plan, docker_socket, root="", skip=False, hccn=True, compat_on=True,
                  daemon_json="/etc/docker/daemon.json", probe_timeout=15, probe_interval=3):
    """pd_host_probe's arguments for one host of the plan (``host_plan``: pd_plan_fleet.hosts[host]).

    With ``skip`` (pd_prechecks_skip) only Docker, the containers and their health are read; ``hccn`` and
    ``compat_on`` are the NPU network and compatibility readings (each off with ``skip``)."""
    specs = containers.host_specs(host_plan)
    images = list(dict.fromkeys(s["image"] for s in specs))  # Jinja's unique: first seen, in order
    hccn = hccn and not skip
    compat_on = compat_on and not skip
    return {
        "docker_socket": docker_socket,
        "paths": [] if skip else prechecks.required_paths(specs) + [host_plan["model_path"]],
        "npu_smi": "" if skip else f"{root}/usr/local/bin/npu-smi",
        "host_facts": not skip,
        "disk_path": "" if skip else host_plan["model_path"],
        "images": [] if skip else images,
        "containers": containers.probe_specs(specs),
        "hccn": {"tool": hccn_tool(root), "conf": f"{root}/etc/hccn.conf", "devices": netchecks.devices(specs)}
        if hccn else {},
        "compat": {"images": images, "driver_info": f"{root}/usr/local/Ascend/driver/version.info",
                   "daemon_json": daemon_json} if compat_on else {},
        "probe_timeout": probe_timeout,
        "probe_interval": probe_interval,
    }


def read(probe):
    """Whether a probe's task result read the host (not unreachable, not failed)."""
    return isinstance(probe, dict) and not (probe.get("unreachable") or probe.get("failed"))


def host_judgement(host, host_plan, probe, skip=False, compat_on=True, min_free_disk="10GiB",
                   vllm_ascend_version=None):
    """{"problems": [this host's own problems], "docker_warnings": [log rotation / memlock findings]}.

    ``probe`` is pd_host_probe's result on ``host`` (or its failed / unreachable task result: that is the
    one problem, "unreachable" or "its probe failed")."""
    specs = containers.host_specs(host_plan)
    compat_on = compat_on and not skip
    ok = read(probe)
    problems = prechecks.problems({
        "host": host,
        "specs": specs,
        "model_path": host_plan["model_path"],
        "ram_reserve_bytes": host_plan["ram_reserve_bytes"],
        "npu_chip": host_plan["npu_chip"],
        "hbm_per_npu_bytes": host_plan["hbm_per_npu_bytes"],
        "min_free_disk_bytes": sizes.to_bytes(min_free_disk, "pd_prechecks_min_free_disk", host),
        "probe": probe,
        "checks": not skip,
    })
    if compat_on and ok:
        problems += compat.problems({"host": host, "vllm_ascend_version": vllm_ascend_version,
                                     "compat": probe.get("compat")})
    warnings = compat.docker_warnings(host, probe.get("compat")) if compat_on and ok else []
    return {"problems": problems, "docker_warnings": warnings}


def host_verdict(problems, warnings=()):
    """One host's verdict: {"failed": True, "msg": its problems, one per line, its Docker warnings after them as
    ``WARNING`` lines}, or {"failed": False, "msg": [its warnings]}."""
    if problems:
        return {"failed": True, "msg": "\n".join(list(problems) + [f"WARNING {w}" for w in warnings])}
    return {"failed": False, "msg": list(warnings)}


def host_problems(host, probe):
    """(problems, warnings) of one host from its pd_host_check result: its own judgement, the variables it
    refused, or the one problem of a host that could not be reached or read."""
    if isinstance(probe, dict) and read(probe) and isinstance(probe.get("problems"), list):
        return list(probe["problems"]), list(probe.get("docker_warnings") or [])
    if not isinstance(probe, dict) or read(probe):
        # read, but not judged (not a pd_host_check result): nothing to say about it here
        return [], []
    return prechecks.problems({"host": host, "specs": [], "probe": probe}), []


def fleet_verdict(plan, probes, play_hosts, play_hosts_all=None, pull_failed=False, hccn=True, run_tags=None,
                  skip_tags=None, cluster_batch=None, parallel=False):
    """The prechecks' verdict on the play's hosts, from each host's pd_host_check result (``probes``).

    Returns {"verdicts": {host: {"failed", "msg"}} (the play's first host also carries the problems of the
    play: NPU network across a cluster, a --tags selection that leaves a cluster half deployed),
    "fleet_problems": {that first host: [the play's problems]} ({} when there are none),
    "problems": [every problem, host by host], "warnings": [every Docker warning], "rollout": the
    order.rollout_targets of the play or None (a host with a problem, a host that left the play, a failed
    image pull: nothing is rolled), "ping_targets": {prefill host: its NPU ping targets} of the rolled
    clusters ({} without ``hccn`` or a rollout)}."""
    play_hosts = list(play_hosts or [])
    probes = probes if isinstance(probes, dict) else {}
    verdicts, problems, warnings, fleet = {}, [], [], {}
    for host in play_hosts:
        own, warned = host_problems(host, probes.get(host))
        if host == play_hosts[0]:
            play = netchecks.cluster_problems(plan, {h: probes.get(h) for h in play_hosts}) if hccn else []
            tags = selection.tag_selection(run_tags if run_tags is not None else ["all"], skip_tags)
            if tags.get("partial") and all(read(probes.get(h)) for h in play_hosts):
                play += selection.tag_problems(plan, {h: probes.get(h) for h in play_hosts}, play_hosts,
                                               run_tags, skip_tags)
            if play:
                fleet[host] = play
                own += play
        verdicts[host] = host_verdict(own, warned)
        problems += own
        warnings += warned
    left = [h for h in (play_hosts_all or play_hosts) if h not in play_hosts]
    rollout, targets = None, {}
    if not problems and not left and not pull_failed:
        rollout = order.rollout_targets(plan, {h: probes.get(h) for h in play_hosts}, play_hosts,
                                        cluster_batch, parallel)
        if hccn:
            rolled = [h for h in play_hosts if h in rollout["hosts"]]
            targets = netchecks.ping_targets(plan, {h: probes.get(h) for h in rolled})
    return {"verdicts": verdicts, "fleet_problems": fleet, "problems": problems, "warnings": warnings,
            "rollout": rollout, "ping_targets": targets}
