# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Values no engine would take, refused on the field the operator wrote before any rule runs.

An absurd value would otherwise surface only through what follows from it: an astronomically large
decode ``max_num_seqs`` derives ``max_num_batched_tokens`` = seqs x (1 + draft tokens), which the
danger-zone rule then blamed on a key the operator never wrote, and the weights rule printed a
runtime reserve of millions of EiB. ``cluster_violations`` checks each such value against the limit it
really has, names the operator's field and gives a limit that can be true; ``plugins/plugin_utils/plan/fleet.py``
stops the cluster there, so no rule repeats it in other words.

- ``engine.max_model_len`` above the model's context (``plugins/plugin_utils/data/models.yml`` ``max_model_len``
  of the family): vLLM refuses to start (vllm@v0.27.1 vllm/config/model.py _get_and_verify_max_len)
  unless the role's env sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.
- ``workload`` token counts whose requests are longer than the model's context: no max_model_len can
  serve them (rule_max_model_len would ask for a max_model_len beyond the model).
- tokens of one step (``max_num_batched_tokens``, on decode derived from ``max_num_seqs`` x (1 + draft
  tokens)) and ``max_num_seqs`` (each running sequence takes at least one token of every step) whose
  activation memory alone (models.yml ``runtime_reserve``) does not fit the role's smallest
  HBM x gpu_memory_utilization: no weights and no KV could be loaded beside them.
- sizes Docker cannot take: ``shm_size`` / ``cpu_offload`` above 2^63 - 1 bytes (Docker's ShmSize and
  the connectors' byte counts are int64).
"""

from ..plan import capacity, model
from ..shared import sizes
from .violation import error

_TRUE = ("1", "true", "yes")


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _own(raw, role, key):
    """The value the operator wrote for ``<role>.engine.<key>`` (None when left to the defaults)."""
    return (((raw or {}).get(role) or {}).get("engine") or {}).get(key)


def cluster_violations(cluster, raw, hosts):
    """Errors for values beyond what the engine or the model allows (see the module docstring).

    ``cluster`` is the normalized cluster, ``raw`` its ``pd_cluster`` as written, ``hosts`` the host
    records (role, hbm_per_npu_bytes).
    """
    out = []
    fam = capacity.family_data(cluster["model"].get("family")) or {}
    for role in model.ROLES:
        rcfg = cluster["roles"][role]
        engine = rcfg["engine"]
        where = f"{cluster['name']}/{role}"
        env = dict(cluster.get("env_common") or {}, **(rcfg.get("env") or {}))
        limit = fam.get("max_model_len")
        length = engine.get("max_model_len")
        long_ok = str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")).lower() in _TRUE
        if _int(limit) and _int(length) and length > limit and not long_ok:
            out.append(error(where, f"{role}.engine.max_model_len",
                             f"{length} is beyond the context of model family {cluster['model']['family']} "
                             f"({limit} tokens, plugins/plugin_utils/data/models.yml max_model_len): vLLM refuses to start "
                             "(max_model_len greater than the derived max_model_len of config.json)",
                             f"set {role}.engine.max_model_len to the business p99 prompt + output, at most {limit}"))
        out.extend(_step_tokens(cluster, raw, role, hosts, fam.get("runtime_reserve")))
        for key in ("shm_size", "cpu_offload"):
            value = rcfg.get(f"{key}_bytes")
            if _int(value) and value > INT64_MAX:
                out.append(error(where, f"{role}.{key}", f"{sizes.to_human(value)} is more bytes than Docker and the "
                                 f"connectors count (2^63 - 1)", f"set {role}.{key} to what the host really has"))
    out.extend(_workload(cluster, fam.get("max_model_len")))
    return out


def _workload(cluster, limit):
    work = cluster.get("workload") or {}
    if not _int(limit):
        return []
    out = []
    prompt, output, avg = (work.get(k) for k in ("p99_prompt_tokens", "p99_output_tokens", "avg_prompt_tokens"))
    family = cluster["model"]["family"]
    if _int(prompt) and _int(output) and prompt + output > limit:
        field = "workload.p99_prompt_tokens" if prompt >= output else "workload.p99_output_tokens"
        out.append(error(cluster["name"], field,
                         f"p99 prompt + output = {prompt} + {output} tokens is longer than the context of model family "
                         f"{family} ({limit} tokens): no max_model_len can serve such requests, vLLM refuses them",
                         f"give the measured p99 token counts (their sum at most {limit})"))
    if _int(avg) and avg > limit:
        out.append(error(cluster["name"], "workload.avg_prompt_tokens",
                         f"{avg} tokens is longer than the context of model family {family} ({limit} tokens)",
                         "give the measured average prompt length"))
    return out


#: the largest byte count Docker (ShmSize, int64) and the connectors' JSON ints take
INT64_MAX = 2 ** 63 - 1


def follows_from(violation, refused):
    """True for a violation that only repeats an absurd value already refused on its own field
    (``refused``: the fields of cluster_violations): vLLM's batched tokens >= max_num_seqs check asks
    for max_num_batched_tokens >= an astronomical max_num_seqs."""
    field = str(violation.get("field", ""))
    return field.endswith(".engine.max_num_batched_tokens") and \
        field.replace("max_num_batched_tokens", "max_num_seqs") in refused


def _step_tokens(cluster, raw, role, hosts, reserve):
    """The tokens of one step whose activations alone overflow HBM, on the field that sets them."""
    engine = cluster["roles"][role]["engine"]
    tokens, gmu = engine.get("max_num_batched_tokens"), engine.get("gpu_memory_utilization")
    hbm = [h["hbm_per_npu_bytes"] for h in hosts if h.get("role") == role and _int(h.get("hbm_per_npu_bytes"))]
    if not (isinstance(reserve, dict) and _int(tokens) and hbm and isinstance(gmu, (int, float))):
        return []
    fixed = reserve.get("fixed_bytes_per_npu") or 0
    per_token = reserve.get("activation_bytes_per_batched_token") or 0
    budget = int(min(hbm) * gmu)
    if not per_token:
        return []
    fit = max(0, (budget - fixed) // per_token)  # the most tokens whose activations fit at all
    seqs = engine.get("max_num_seqs")
    if fixed + per_token * tokens <= budget:
        if _int(seqs) and seqs > fit:  # every running sequence takes >= 1 token of each step
            return [error(f"{cluster['name']}/{role}", f"{role}.engine.max_num_seqs",
                          f"{seqs} sequences take at least one token each per step: their activation memory alone is "
                          f"more than the {sizes.to_human(min(hbm))} x gpu_memory_utilization {gmu} per NPU",
                          f"set {role}.engine.max_num_seqs to at most {min(fit, tokens)} (max_num_batched_tokens is "
                          f"{tokens}; the article starts at {capacity.START_MAX_NUM_SEQS})")]
        return []
    where = f"{cluster['name']}/{role}"
    seqs, draft = engine.get("max_num_seqs"), engine.get("num_speculative_tokens") or 0
    budget_text = f"{sizes.to_human(min(hbm))} x gpu_memory_utilization {gmu} = {sizes.to_human(budget)} per NPU"
    if _int(draft) and 1 + draft > fit:
        return [error(where, f"{role}.engine.num_speculative_tokens",
                      f"{draft} draft tokens per sequence and step: their activation memory alone is more than the "
                      f"{budget_text}", f"set {role}.engine.num_speculative_tokens: 1 (MTP, as upstream) or 0")]
    if _own(raw, role, "max_num_batched_tokens") is None and _int(seqs) and seqs * (1 + draft) == tokens:
        # derived (decode: max_num_seqs x (1 + draft tokens)): the operator wrote max_num_seqs
        return [error(where, f"{role}.engine.max_num_seqs",
                      f"{seqs} sequences x (1 + {draft} draft tokens) per step: their activation memory alone "
                      f"is more than the {budget_text}, so no weights or KV could load beside them",
                      f"set {role}.engine.max_num_seqs to at most {fit // (1 + draft)} (the article starts at "
                      f"{capacity.START_MAX_NUM_SEQS} and raises it while KV usage stays < 0.7)")]
    return [error(where, f"{role}.engine.max_num_batched_tokens",
                  f"{tokens} tokens per step: their activation memory alone is more than the {budget_text}, "
                  "so no weights or KV could load beside them",
                  f"set {role}.engine.max_num_batched_tokens to at most {min(fit, capacity.UPPER_BOUND)} "
                  f"(the article's 910B3 upper bound is {capacity.UPPER_BOUND})")]
