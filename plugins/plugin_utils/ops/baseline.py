# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Step 5, the KV baseline: bare engines started at two max-model-len values, their start-up logs
fitted back to a per-request footprint (``baseline_report``) and judged against the model's band."""

import copy
from collections.abc import Mapping

from ..plan import model
from ..rollout.containers import clean_log, log_tail
from ..shared import sizes
from ..shared.errors import PdError
from . import common, logparse
from .common import DEFAULT_FAMILY, model_band, p99_request_len

_DROP_FLAGS = ("--kv-transfer-config", "--additional-config")


def baseline_spec(spec, max_model_len):
    """The bare-engine launch spec derived from a rank's spec for the KV baseline (article §6 step 2).

    Same image, devices, mounts, env and flags, except: no ``--kv-transfer-config`` and no
    ``--additional-config`` (no connector, no recompute scheduler), ``--max-model-len`` set to
    ``max_model_len``, container ``<name>-baseline``, no pinned offload, no restart policy, labels
    ``pd.baseline=true`` (stop-pd.yml still finds it by ``pd.managed-by``).
    """
    where = "pd_baseline_spec"
    if not isinstance(spec, Mapping) or spec.get("kind") != "engine":
        raise PdError(where, "spec", "is not an engine launch spec", "pass one spec of plan.hosts[host].specs")
    sizes.check_int(max_model_len, "max_model_len", where, minimum=1)
    command, skip = [], False
    for arg in spec["command"]:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _DROP_FLAGS:
            skip = "=" not in arg
            continue
        if flag == "--max-model-len":
            skip = "=" not in arg
            continue
        command.append(arg)
    insert = command.index("--tensor-parallel-size") + 2 if "--tensor-parallel-size" in command else len(command)
    command[insert:insert] = ["--max-model-len", str(max_model_len)]
    out = copy.deepcopy(dict(spec))
    out.update({
        "name": f"{spec['name']}-baseline",
        "command": command,
        "pinned_offload_bytes": 0,
        "restart_policy": "no",
        "baseline_of": spec["name"],
        "max_model_len": max_model_len,
        "labels": {"pd.cluster": spec["cluster"], "pd.role": spec["role"], "pd.managed-by": "pd-deploy",
                   "pd.baseline": "true", "pd.baseline-max-model-len": str(max_model_len)},
    })
    return out


def baseline_boots(bare_specs, logs, max_model_len):
    """Boots for ``baseline_report`` from the bare-engine specs and their logs ``{name: text}``.

    Returns ``[{name, role, max_model_len, log_text}]``; ``name`` is the rank the bare engine stands
    for. A missing log raises ``PdError`` naming the container.
    """
    where = "pd_baseline_boots"
    sizes.check_int(max_model_len, "max_model_len", where, minimum=1)
    if not isinstance(logs, Mapping):
        raise PdError(where, "logs", f"{type(logs).__name__} is not {{name: log text}}", "pass pd_docker_logs' result")
    out = []
    for spec in bare_specs or []:
        text = logs.get(spec["name"])
        if not isinstance(text, str):
            raise PdError(where, spec["name"], "its log could not be read",
                          "check the Docker socket (pd_docker_socket) and that the container existed")
        out.append({"name": spec.get("baseline_of", spec["name"]), "role": spec.get("role"),
                    "max_model_len": max_model_len, "log_text": clean_log(text)})
    return out


def baseline_failure(unhealthy, logs, host):
    """The failure message for bare engines that never answered their health URL (with log tails).

    ``logs`` is ``{name: text}`` (``pd_docker_logs``)."""
    logs = logs if isinstance(logs, Mapping) else {}
    lines = [f"{host}: {len(unhealthy)} bare engine(s) never became healthy; they were removed and no "
             "baseline was recorded for this host."]
    for spec in unhealthy:
        lines.append(f"- {spec['name']} (max-model-len {spec.get('max_model_len')}, {spec['health_url']}):")
        tail = log_tail(logs.get(spec["name"]))
        if tail:
            lines.append(tail)
    lines.append("A max-model-len whose KV does not fit one request fails at start-up: choose smaller "
                 "pd_ops_baseline_lengths, or check the devices with playbooks/deploy_pd.yml's prechecks.")
    return "\n".join(lines)


def image_identity(image):
    """``{tags, id, digests, created, labels}`` of one docker_image_info image (what was measured)."""
    if not isinstance(image, Mapping):
        raise PdError("pd_image_identity", "image", f"{type(image).__name__} is not image info",
                      "pass one item of docker_image_info's images")
    return {"tags": image.get("RepoTags") or [], "id": image.get("Id"), "digests": image.get("RepoDigests") or [],
            "created": image.get("Created"), "labels": (image.get("Config") or {}).get("Labels") or {}}


def _boot(boot, index, where):
    if not isinstance(boot, Mapping) or "log_text" not in boot:
        raise PdError(where, f"boots[{index}]", "is not a boot", "give {max_model_len, log_text[, name, role]}")
    parsed = logparse.parse_startup_log(boot["log_text"])
    length = boot.get("max_model_len", parsed["concurrency_len"])
    sizes.check_int(length, f"boots[{index}].max_model_len", where, minimum=1)
    if parsed["concurrency_len"] != length:
        raise PdError(where, f"boots[{index}].max_model_len",
                      f"the log reports concurrency for {parsed['concurrency_len']} tokens, not {length}",
                      "pass the log of the boot at that max-model-len")
    return length, parsed


def _judge_with_cause(value, band):
    judged = logparse.judge_bytes_per_token(value, band)
    causes = {
        "ok": None,
        "low": "the band is for another model or unit, or the log is another model's",
        "high": "a wider KV cache dtype than the band assumes (bf16 vs 8/4-bit) or another checkpoint; "
                "for a single ratio: the fixed per-request part at a short max-model-len",
        "far_high": "the hybrid KV cache manager is off (--disable-hybrid-kv-cache-manager, or a KV connector "
                    "that disables it: keep --no-disable-hybrid-kv-cache-manager) — KV compression is lost",
    }
    judged["likely_cause"] = causes[judged["verdict"]]
    return judged


def baseline_report(boots, band=None, family=None, config=None):
    """KV footprint of a cluster from bare-engine boots at two max-model-len values (DOMAIN.md §5).

    ``boots``: ``[{max_model_len, log_text, name?, role?}]``, one per rank and length (the ranks'
    start-up logs). ``band``: ``{min, max, source}`` override of plugins/plugin_utils/data/models.yml's band for
    ``family``; ``config``: the cluster's ``pd_cluster`` (adds its P99 request length and
    configured max-model-len to the tables).

    Returns ``{boots, fits, verdict, band}``:
    - per boot: the article's single ratio (available / tokens), KV tokens per DP group (= per
      engine, as printed), per-request footprint and the start-up "one request needs ~X"
      reservation (max_model_len x single ratio);
    - per role (``all`` when boots carry no role): the two-point fit (marginal bytes per token,
      fixed bytes per request) through the worst (largest) footprint at the shortest and longest
      length, judged against the band; at the configured max-model-len and the P99 request length
      the true footprint from the fit against the article's estimate (length x single ratio), the
      requests and tokens that fit one worker's KV at P99;
    - ``verdict``: the worst judgement, with its likely cause.
    """
    where = "pd_baseline_report"
    if not isinstance(boots, (list, tuple)) or not boots:
        raise PdError(where, "boots", "no boots", "pass the start-up logs of the bare engines at two max-model-len values")
    cluster = common.normalized(config, where) if config is not None else None
    fam = family or ((cluster or {}).get("model") or {}).get("family")
    band = model_band(fam, band)
    rows = [_boot_row(boot, index, where, band) for index, boot in enumerate(boots)]
    fits = {role: _role_fit([r for r in rows if (r["role"] or "all") == role], band, cluster, role)
            for role in sorted({r["role"] or "all" for r in rows})}
    judged = [f["judge"] for f in fits.values() if f.get("judge")] or [r["judge"] for r in rows]
    order = ("far_high", "high", "low", "ok")
    worst = min(judged, key=lambda j: order.index(j["verdict"]))
    basis = "two-point fit (marginal bytes per token)" if any(f.get("judge") for f in fits.values()) \
        else "single ratio (one length only: only a hint)"
    return {"boots": rows, "fits": fits, "band": band, "family": fam or DEFAULT_FAMILY,
            "verdict": {"verdict": worst["verdict"], "basis": basis, "message": worst["message"],
                        "likely_cause": worst["likely_cause"]}}


def _boot_row(boot, index, where, band):
    """One boot's figures: the article's single ratio, KV tokens, footprint, start-up reservation."""
    length, parsed = _boot(boot, index, where)
    return {
        "name": boot.get("name"), "role": boot.get("role"), "max_model_len": length,
        "available_bytes": parsed["available_bytes"], "kv_tokens_per_dp_group": parsed["tokens"],
        "max_concurrency": parsed["max_concurrency"], "workers": parsed["workers"],
        "bytes_per_token": parsed["bytes_per_token"], "per_request_bytes": parsed["per_request_bytes"],
        "startup_reservation_bytes": round(length * parsed["bytes_per_token"]),
        "judge": _judge_with_cause(parsed["bytes_per_token"], band),
    }


def _role_fit(mine, band, cluster, role):
    """The two-point fit of one role's boots (``mine``), judged, and what fits at the target lengths."""
    lengths = sorted({r["max_model_len"] for r in mine})
    entry = {"lengths": lengths}
    if len(lengths) < 2:
        entry["fit"] = None
        entry["note"] = "one max-model-len only: boot again at a second length for the two-point fit"
        return entry
    worst = {L: max((r for r in mine if r["max_model_len"] == L), key=lambda r: r["per_request_bytes"])
             for L in (lengths[0], lengths[-1])}
    fit = logparse.two_point_fit(*worst.values())
    entry["fit"] = fit
    entry["judge"] = _judge_with_cause(fit["marginal_bytes_per_token"], band)
    available = min(r["available_bytes"] for r in mine if r["max_model_len"] == lengths[-1])
    entry["available_bytes_per_worker"] = available
    entry["kv_tokens_marginal_only"] = int(available // max(fit["marginal_bytes_per_token"], 1e-9))
    if len(lengths) > 2:
        entry["note"] = f"fitted through {lengths[0]} and {lengths[-1]}; middle lengths not used"
    ratio_at = {r["max_model_len"]: r["bytes_per_token"] for r in mine}
    entry["requests"] = [_fit_at(fit, ratio_at, available, label, length)
                         for label, length in _target_lengths(cluster, role, lengths).items()]
    return entry


def _target_lengths(cluster, role, lengths):
    """{label: tokens} the fit is read at: the cluster's lengths, else the longest boot."""
    if cluster is None:
        return {"longest boot": lengths[-1]}
    rname = role if role in model.ROLES else "decode"
    return {"configured max_model_len": cluster["roles"][rname]["engine"]["max_model_len"],
            "P99 request (prompt + output)": p99_request_len(cluster),
            "average prompt": cluster["workload"]["avg_prompt_tokens"]}


def _fit_at(fit, ratio_at, available, label, length):
    """The true footprint at ``length`` against the article's estimate, and what fits one worker."""
    nearest = min(ratio_at, key=lambda L: abs(L - length))
    true = logparse.footprint_at(fit, length)
    article = round(length * ratio_at[nearest])
    return {
        "what": label, "tokens": length, "true_bytes": true,
        "article_estimate_bytes": article, "single_ratio_from_boot_at": nearest,
        "requests_per_worker": int(available // true) if true else None,
        "tokens_per_worker": int(available // true) * length if true else None,
    }


def baseline_markdown(report, cluster_name=None, versions=None):
    """A ``baseline_report`` as Markdown (build/<inventory>/reports/<cluster>/baseline.md)."""
    if not isinstance(report, Mapping) or "boots" not in report:
        raise PdError("pd_baseline_markdown", "report", "is not a baseline report", "pass pd_baseline_report's result")
    v = report["verdict"]
    lines = [f"# KV baseline{' of ' + cluster_name if cluster_name else ''}", ""]
    for key, value in (versions or {}).items():
        if key == "images" and isinstance(value, list):
            for image in value:
                image = image if isinstance(image, Mapping) else {"id": image}
                lines.append(f"- image: {', '.join(image.get('tags') or []) or '-'} (id {image.get('id')}; "
                             f"digests {', '.join(image.get('digests') or []) or 'none (built locally?)'})")
        else:
            lines.append(f"- {key}: {value}")
    if versions:
        lines.append("")
    lines += [f"**Verdict: {v['verdict']}** ({v['basis']}): {v['message']}", ""]
    if v.get("likely_cause"):
        lines += [f"Likely cause: {v['likely_cause']}.", ""]
    band = report["band"]
    lines += [f"Expected band ({report['family']}): {band['min']}..{band['max']} bytes/token per worker — {band['source']}", "",
              "## Boots (bare engine, no KV connector)", "",
              "| rank | max-model-len | available KV / worker | KV tokens / DP group | max concurrency | "
              "single ratio (article) | per-request footprint | start-up reservation |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["boots"]:
        lines.append(f"| {r['name'] or '-'} | {r['max_model_len']} | {common.human(r['available_bytes'])} | "
                     f"{r['kv_tokens_per_dp_group']:,} | {r['max_concurrency']:.2f}x | {r['bytes_per_token']:.0f} B/token | "
                     f"{common.human(r['per_request_bytes'])} | {common.human(r['startup_reservation_bytes'])} |")
    for role, entry in report["fits"].items():
        lines += ["", f"## Two-point fit: {role}", ""]
        if not entry.get("fit"):
            lines.append(entry.get("note", "no fit"))
            continue
        fit = entry["fit"]
        lines += [f"- marginal: **{fit['marginal_bytes_per_token']:.0f} bytes/token** per worker "
                  f"({entry['judge']['verdict']} against {band['min']}..{band['max']}"
                  + (f"; likely cause: {entry['judge']['likely_cause']}" if entry['judge'].get('likely_cause') else "")
                  + ")",
                  f"- fixed per request: {common.human(fit['fixed_bytes_per_request'])}",
                  f"- KV of one worker {common.human(entry['available_bytes_per_worker'])} holds "
                  f"{entry['kv_tokens_marginal_only']:,} tokens at the marginal rate alone", "",
                  "| request | tokens | true footprint (fit) | article estimate (tokens x single ratio) | "
                  "requests per worker | tokens per worker |", "| --- | --- | --- | --- | --- | --- |"]
        for q in entry["requests"]:
            lines.append(f"| {q['what']} | {q['tokens']} | {common.human(q['true_bytes'])} | {common.human(q['article_estimate_bytes'])} "
                         f"(ratio at {q['single_ratio_from_boot_at']}) | {q['requests_per_worker']} | "
                         f"{q['tokens_per_worker']:,} |")
        if entry.get("note"):
            lines += ["", entry["note"]]
    lines += ["", "The start-up \"one request needs ~X\" is max-model-len x single ratio: a worst-case "
              "reservation at max-model-len. Plan with the fit; set max-model-len to the P99 request."]
    return "\n".join(lines) + "\n"
