"""Values no engine would take, refused on the field the operator wrote before any rule runs.

An absurd value would otherwise surface only through what follows from it: an astronomically large
decode ``max_num_seqs`` derives ``max_num_batched_tokens`` = seqs x (1 + draft tokens), which the
danger-zone rule then blamed on a key the operator never wrote, and the weights rule printed a
runtime reserve of millions of EiB. ``cluster_violations`` checks each such value against the limit it
really has, names the operator's field and gives a limit that can be true; ``pd_deploy/fleet.py``
stops the cluster there, so no rule repeats it in other words.

- ``engine.max_model_len`` above the model's context (``pd_deploy/data/models.yml`` ``max_model_len``
  of the family): vLLM refuses to start (vllm@v0.27.1 vllm/config/model.py _get_and_verify_max_len)
  unless the role's env sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.
- tokens of one step (``max_num_batched_tokens``, on decode derived from ``max_num_seqs``) whose
  activation memory alone (models.yml ``runtime_reserve``) does not fit the role's smallest
  HBM x gpu_memory_utilization: no weights and no KV could be loaded beside them.
"""

from pd_deploy import capacity, model, sizes

_TRUE = ("1", "true", "yes")


def _v(where, field, message, fix):
    return {"level": "error", "where": where, "field": field, "message": message, "fix": fix}


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
            out.append(_v(where, f"{role}.engine.max_model_len",
                          f"{length} is beyond the context of model family {cluster['model']['family']} "
                          f"({limit} tokens, pd_deploy/data/models.yml max_model_len): vLLM refuses to start "
                          "(max_model_len greater than the derived max_model_len of config.json)",
                          f"set {role}.engine.max_model_len to the business p99 prompt + output, at most {limit}"))
        out.extend(_step_tokens(cluster, raw, role, hosts, fam.get("runtime_reserve")))
    return out


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
    if not per_token or fixed + per_token * tokens <= budget:
        return []
    fit = max(0, (budget - fixed) // per_token)  # the most tokens whose activations fit at all
    where = f"{cluster['name']}/{role}"
    seqs, draft = engine.get("max_num_seqs"), engine.get("num_speculative_tokens") or 0
    budget_text = f"{sizes.to_human(min(hbm))} x gpu_memory_utilization {gmu} = {sizes.to_human(budget)} per NPU"
    if _own(raw, role, "max_num_batched_tokens") is None and _int(seqs) and seqs * (1 + draft) == tokens:
        # derived (decode: max_num_seqs x (1 + draft tokens)): the operator wrote max_num_seqs
        return [_v(where, f"{role}.engine.max_num_seqs",
                   f"{seqs} sequences x (1 + {draft} draft tokens) per step: their activation memory alone "
                   f"is more than the {budget_text}, so no weights or KV could load beside them",
                   f"set {role}.engine.max_num_seqs to at most {fit // (1 + draft)} (the article starts at "
                   f"{capacity.START_MAX_NUM_SEQS} and raises it while KV usage stays < 0.7)")]
    return [_v(where, f"{role}.engine.max_num_batched_tokens",
               f"{tokens} tokens per step: their activation memory alone is more than the {budget_text}, "
               "so no weights or KV could load beside them",
               f"set {role}.engine.max_num_batched_tokens to at most {min(fit, capacity.UPPER_BOUND)} "
               f"(the article's 910B3 upper bound is {capacity.UPPER_BOUND})")]


FILTERS = {}
