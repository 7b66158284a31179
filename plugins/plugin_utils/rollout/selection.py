# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a deploy runs of itself under ``--tags`` / ``--skip-tags`` (docs/guide/prechecks.md, "Tags").

The playbooks carry these tags: validate is ``always`` (every later play reads the plan); the prechecks
play ``prechecks`` (and the rollout's and the report's tags: they read what runs from it); the rollout's
engine ranks ``engines``, its proxy ``proxy`` (the tasks both need: lock, reading, removal of dropped
ranks, unlock are ``always`` inside a rollout the selection lets run); the closing report ``report``;
the image pull ``pull``. A selection that runs one part of a cluster's rollout and not the other would
leave the cluster half deployed: ``tag_problems`` names it, and the prechecks refuse the run.
"""

from collections.abc import Mapping

from ..shared.errors import PdError
from .containers import host_specs, spec_state
from .order import rollout_targets

#: the tags a deploy documents, in the order of the run
TAGS = ("prechecks", "pull", "engines", "proxy", "report")


def _tag_list(value, field):
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise PdError("pd_tag_selection", field, f"expected a list of tag names, got {value!r}",
                      "pass ansible_run_tags and ansible_skip_tags")
    return list(value)


def tag_selection(run_tags, skip_tags=None):
    """{tag: whether this run runs the tasks of that tag} for each of TAGS, from ``ansible_run_tags``
    (``["all"]`` without --tags) and ``ansible_skip_tags``; ``rollout`` is engines or proxy."""
    run = set(_tag_list(run_tags, "run_tags")) or {"all"}
    skip = set(_tag_list(skip_tags, "skip_tags"))
    out = {}
    for tag in TAGS:
        chosen = "all" in run or tag in run or "tagged" in run
        out[tag] = chosen and tag not in skip and "all" not in skip and "tagged" not in skip
    out["rollout"] = out["engines"] or out["proxy"]
    out["partial"] = out["engines"] != out["proxy"]
    return out


def _flag(selection):
    return "--skip-tags proxy or --tags without proxy" if selection["engines"] else \
        "--skip-tags engines or --tags without engines"


def tag_problems(plan, probes, play_hosts, run_tags, skip_tags=None):
    """Why this run's tag selection would leave a cluster half deployed, one message per cluster ([]: fine).

    Only a selection that rolls the engine ranks without the proxy, or the proxy without the engine ranks,
    can: then each cluster the rollout would change (``rollout_targets`` of ``probes``, the prechecks'
    readings) is refused when the part left out has work to do. Without the proxy: a proxy that does not
    run its launch spec, one whose instances differ from the plan (re-wired live), new engine ranks (the
    proxy would not serve them) or ranks the inventory dropped (they are drained out of the proxy before
    they are removed). Without the engines: an engine rank that does not run its launch spec.
    """
    selection = tag_selection(run_tags, skip_tags)
    if not selection["rollout"] or not selection["partial"]:
        return []
    if not isinstance(probes, Mapping):
        raise PdError("pd_tag_problems", "probes", "expected {host: pd_host_probe result}",
                      "pass the prechecks' probe of every play host")
    targets = rollout_targets(plan, probes, play_hosts)
    out = []
    for cluster in targets["changed"]:
        hosts = [h for h in targets["hosts"] if plan["hosts"][h]["cluster"] == cluster]
        left = []
        for host in hosts:
            entry = plan["hosts"][host]
            pending = set(targets["pending"].get(host) or [])
            seen = {c["name"]: c for c in probes[host].get("containers") or [] if isinstance(c, Mapping)}
            proxy = (entry.get("proxy") or {}).get("name")
            if selection["engines"]:
                if proxy and (proxy in pending or proxy in (targets["reasons"].get(host) or {})):
                    left.append(f"the proxy {proxy} on {host} "
                                + ("does not run its launch spec" if proxy in pending else
                                   "serves other instances than the inventory's (it is re-wired live)"))
                new = [s["name"] for s in entry["specs"] if spec_state(s, seen) == "absent"]
                if new:
                    left.append(f"new engine ranks on {host} the proxy would not serve: {', '.join(new)}")
                if targets["removed"].get(host):
                    left.append(f"ranks the inventory dropped on {host}, drained out of the proxy before they are "
                                f"removed: {', '.join(targets['removed'][host])}")
            else:
                ranks = [s["name"] for s in host_specs(entry) if s["name"] in pending and s["name"] != proxy]
                if ranks:
                    left.append(f"engine ranks on {host} that do not run their launch spec: {', '.join(ranks)}")
        if left:
            part = "the proxy" if selection["engines"] else "the engine ranks"
            out.append(f"{cluster}: refused, nothing touched: this run leaves out {part} ({_flag(selection)}), which "
                       f"would leave the cluster half deployed: {'; '.join(left)} — run without --tags/--skip-tags "
                       "(or with both engines and proxy) to roll the whole cluster")
    return out
