# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A deploy refused before its rollout: which stage refused it and why (``refusal``, the closing failure),
and the closing report that lists the refusal instead of containers (``validate_report``, ``precheck_report``;
``summary.rollout_summary`` returns them when no rollout was decided)."""

from ..hostcheck import verdict
from ..shared.errors import PdError


def _result_lines(result):
    """The lines of a task result's message (a list or a text), without blank ones."""
    msg = (result or {}).get("msg") if isinstance(result, dict) else None
    if isinstance(msg, (list, tuple)):
        msg = "\n".join(str(m) for m in msg)
    return [line.rstrip() for line in str(msg or "").splitlines() if line.strip()]


def _rule_errors(plan):
    """The messages of the plan's errors (its warnings left out), one line each."""
    pairs = zip(plan.get("violations") or [], plan.get("messages") or [])
    return [" ".join(str(m).split()) for v, m in pairs if isinstance(v, dict) and v.get("level") == "error"]


def validate_report(plan, problem="", play_hosts=None):
    """The closing report of a deploy that validate refused: why (``problem``, the run's refusal of
    ``plan_problem``, else the inventory's errors), each cluster of the run (with a host in ``play_hosts``;
    None: every cluster) not touched (no host was contacted, so no container is listed)."""
    if problem:
        out = ["DEPLOY REFUSED BY VALIDATE: no host was contacted and nothing was touched",
               "Why (fix it, then deploy again):", f"  {' '.join(problem.split())}"]
    else:
        errors = _rule_errors(plan)
        out = [f"DEPLOY REFUSED BY VALIDATE: the inventory breaks {len(errors)} rule(s); no host was contacted "
               "and nothing was touched",
               "Problems found (fix each in the inventory, then deploy again):"]
        out += [f"  {m}" for m in errors]
    hosts = None if play_hosts is None else set(play_hosts)
    return out + [f"{name}: not touched: the deploy was refused before any host was contacted"
                  for name, summary in plan["clusters"].items()
                  if hosts is None or hosts.intersection(summary.get("hosts") or [])]


def _lost(probe):
    """A probe that read nothing: unreachable, or failed (not one that refused the role's variables: that
    is a problem of the run's inventory, reported with the others)."""
    return isinstance(probe, dict) and bool(probe.get("unreachable")
                                            or (probe.get("failed") and not probe.get("argument_errors")))


def _pull_failures(host, result):
    """``host: reference: why`` per failed pull of a host's pd_image_pull_result (a loop result), or the one
    line of a host that could not be reached or whose registry login failed (the login's result, ``login``
    naming the registry: nothing was pulled); [] when every pull ended."""
    if not isinstance(result, dict) or not (result.get("failed") or result.get("unreachable")):
        return []
    items = [r for r in result.get("results") or [] if isinstance(r, dict) and (r.get("failed") or r.get("unreachable"))]
    if not items:
        why = " ".join(" ".join(_result_lines(result)).split())[:300] or "no answer"
        what = ("unreachable" if result.get("unreachable")
                else f"the login to the registry {result['login']} failed, nothing was pulled" if result.get("login")
                else "the pull failed")
        return [f"{host}: {what}: {why}"]
    return [f"{host}: {r.get('item')}: " + (" ".join(" ".join(_result_lines(r)).split())[:300] or "no answer")
            for r in items]


def _stage_results(prechecks, key):
    """{host: result} of one stage in ``prechecks`` (a missing or null key: {})."""
    found = prechecks.get(key) if isinstance(prechecks, dict) else None
    return {} if found is None else found


def _verdicts(prechecks, probes):
    """{host: {failed, msg}}: ``prechecks["verdicts"]`` as given, else each host's from what the prechecks
    judged: its pd_host_check result's own ``problems`` (and Docker warnings) and the play's problems the
    decision gave it (``prechecks["fleet"]``: pd_prechecks_verdict's ``fleet_problems``, {host: [lines]}).
    A host whose probe was not judged (lost, or no pd_host_check result) has none."""
    given = _stage_results(prechecks, "verdicts")
    if given or not isinstance(prechecks, dict) or "verdicts" in prechecks:
        return given
    fleet = _stage_results(prechecks, "fleet")
    if not isinstance(fleet, dict) or not isinstance(probes, dict):
        return given
    out = {}
    for host, probe in probes.items():
        if (not isinstance(probe, dict) or _lost(probe)
                or not (isinstance(probe.get("problems"), list) or probe.get("argument_errors"))):
            continue
        own, warned = verdict.host_problems(host, probe)
        out[host] = verdict.host_verdict(own + list(fleet.get(host) or []), warned)
    return out


def refusal(plan, prechecks, problem=""):
    """Why the deploy was refused before its rollout, or {} (it was not): validate's refusal of the run
    (``problem``, from ``plan_problem``: no cluster, the demo inventory, a bad rollout batch size) or of the
    plan (its rule errors), the hosts whose image pull failed, the hosts the prechecks found problems on or could not read, or the prefill hosts
    whose NPUs could not reach their decode NPUs (the ping after the rollout was decided: nothing was rolled).
    ``prechecks`` as for ``rollout_summary``.

    Returns {"stage": "validate" | "pull" | "prechecks" | "ping", "outcome": the report's outcome ("refused by
    validate", "refused by the image pull", "refused by the prechecks", "refused by the NPU ping"), "hosts":
    [hosts with problems or lost, in plan order], "message": the run's closing failure text}; the first
    stage that failed, in the order they run.
    """
    if not isinstance(plan, dict) or "clusters" not in plan:
        raise PdError("pd_deploy_refusal", "plan", f"is {type(plan).__name__}, not a fleet plan",
                      "pass hostvars['localhost'].pd_plan_fleet")
    if not isinstance(problem, str):
        raise PdError("pd_deploy_refusal", "problem", f"is {type(problem).__name__}, not a text",
                      "pass hostvars['localhost'].pd_plan_problem")
    if problem:
        # the text pd_plan_check failed with, word for word
        return {"stage": "validate", "outcome": "refused by validate", "hosts": [],
                "message": f"The deploy was refused by validate (no host was contacted): {problem}"}
    if not plan.get("ok", True):
        errors = _rule_errors(plan)
        return {"stage": "validate", "outcome": "refused by validate", "hosts": [],
                "message": (f"The deploy was refused by validate: the inventory breaks {len(errors)} rule(s), listed "
                            "in the report above; no host was contacted. Fix them and deploy again.")}
    prechecks = {} if prechecks is None else prechecks
    if not isinstance(prechecks, dict):
        raise PdError("pd_deploy_refusal", "prechecks", "expected {probes: {host: result}, fleet: {host: [problems]}}",
                      "pass each host's pd_prechecks_probe and pd_prechecks_verdict's fleet_problems")
    probes, pulls, pings = (_stage_results(prechecks, k) for k in ("probes", "pulls", "pings"))
    verdicts = _verdicts(prechecks, probes)
    if not all(isinstance(x, dict) for x in (probes, verdicts, pulls, pings)):
        raise PdError("pd_deploy_refusal", "prechecks", "expected {probes: {host: result}, fleet: {host: [problems]}, "
                      "pulls: {host: result}, pings: {host: result}} (fleet, pulls and pings optional; verdicts: "
                      "{host: result} instead of fleet)",
                      "pass each host's pd_prechecks_probe, pd_prechecks_verdict's fleet_problems, pd_image_pull_result "
                      "and pd_prechecks_ping_verdict")
    hosts = [h for h in plan["hosts"] if _pull_failures(h, pulls.get(h))]
    if hosts:
        logins = [h for h in hosts if pulls[h].get("login") and not pulls[h].get("unreachable")]
        what = "the registry login or pulls failed" if logins else "pulls failed"
        return {"stage": "pull", "outcome": "refused by the image pull", "hosts": hosts,
                "message": (f"The deploy was refused by the image pull: {what} on {', '.join(hosts)}, listed in "
                            "the report above; no container was touched. Fix the registry, the image reference or "
                            "the credentials (docs/guide/pull.md), or leave their cluster out with --limit, and "
                            "deploy again.")}
    hosts = [h for h in plan["hosts"] if _lost(probes.get(h)) or (verdicts.get(h) or {}).get("failed")]
    if hosts:
        return {"stage": "prechecks", "outcome": "refused by the prechecks", "hosts": hosts,
                "message": (f"The deploy was refused by the prechecks: problems on {', '.join(hosts)}, listed in the "
                            "report above; no container was touched. Fix them (or leave their cluster out with "
                            "--limit) and deploy again.")}
    hosts = [h for h in plan["hosts"] if (pings.get(h) or {}).get("failed")]
    if hosts:
        return {"stage": "ping", "outcome": "refused by the NPU ping", "hosts": hosts,
                "message": (f"The deploy was refused by the NPU ping: prefill NPUs on {', '.join(hosts)} cannot reach "
                            "their decode NPUs, listed in the report above; no container was touched. Fix the NPU "
                            "network (hccn_tool; docs/guide/troubleshoot.md), or leave their cluster out with "
                            "--limit, and deploy again.")}
    return {}


def _host_lines(plan, host, result):
    """The lines of a failed check's message, each naming its host (the play's first host also judges the
    others' NPU network, so a line may name another)."""
    return [f"  {line}" if line.split(":", 1)[0] in plan["hosts"] else f"  {host}: {line}"
            for line in _result_lines(result)]


def precheck_report(plan, play_hosts, prechecks):
    """The closing report of a deploy that stopped before its rollout: in the image pull, in the prechecks (a
    host's problems, a host that could not be reached or read), in the NPU ping after the rollout was decided,
    or before them. Nothing was touched, so no container is listed as if it ran: each cluster is named as not
    touched, with the failed pulls, the problems, the lost hosts and the NPU ping problems."""
    probes, pulls, pings = (_stage_results(prechecks or {}, k) or {} for k in ("probes", "pulls", "pings"))
    verdicts = _verdicts(prechecks or {}, probes) or {}
    pulled = [f"  {line}" for host in plan["hosts"] for line in _pull_failures(host, pulls.get(host))]
    problems, lost, unjudged, unreached = [], [], [], []
    for host in plan["hosts"]:
        probe, verdict = probes.get(host) or None, verdicts.get(host) or None
        if _lost(probe):
            why = " ".join(" ".join(_result_lines(probe)).split())[:300] or "no answer"
            lost.append(f"  {host}: {'unreachable' if probe.get('unreachable') else 'its probe failed'}: {why}")
        elif isinstance(verdict, dict) and verdict.get("failed"):
            problems.extend(_host_lines(plan, host, verdict))
        elif not isinstance(verdict, dict):
            unjudged.append(host)
        if isinstance(pings.get(host), dict) and pings[host].get("failed"):
            unreached.extend(_host_lines(plan, host, pings[host]))
    if pulled:
        head = ["DEPLOY REFUSED BY THE IMAGE PULL: no container was touched (the images are pulled before any "
                "host changes)"]
    elif problems or lost:
        head = ["DEPLOY REFUSED BY THE PRECHECKS: no container was touched (every host is checked before any "
                "changes)"]
    elif unreached:
        head = ["DEPLOY REFUSED BY THE NPU PING: no container was touched (the prefill NPUs ping their decode "
                "NPUs before any host changes)"]
    else:
        head = ["DEPLOY STOPPED before its rollout (see the failed task above); no container was touched"]
    out = list(head)
    if pulled:
        out += ["Pulls that failed (fix the registry, the image reference or the credentials, then deploy again):"]
        out += pulled
    if problems:
        out += ["Problems found (fix each, then deploy again):"] + problems
    if lost:
        out += ["Hosts that could not be read (bring them back, or leave their cluster out with --limit):"] + lost
    if unreached:
        out += ["NPU ping problems (fix the NPU network between the paired NPUs, then deploy again):"] + unreached
    if unjudged and (problems or lost):
        out.append("Not judged (one host that fails or cannot be reached stops the prechecks of all): "
                   f"{', '.join(unjudged)}")
    hosts = set(play_hosts or []) | set(probes) | set(verdicts) | set(pulls) | set(pings)
    for name, summary in plan["clusters"].items():
        if hosts.intersection(summary["hosts"]):
            out.append(f"{name}: not touched: the deploy stopped before its rollout")
    return out
