# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Cross-field rules of one cluster (DOMAIN.md §3-§4): every violation, all at once.

``check_cluster(cluster, topo)`` runs each rule of ``RULES`` in order on the normalized cluster and
its topology (docs/design.md) and returns the concatenated violations, each a
``plugin_utils.validate.violation.Violation``. A rule never raises for a bad value: it reports it. Only
inputs of the wrong shape (not the normalized structures at all) raise ``PdError``.

Each rule is one small function ``rule(ctx) -> list`` where ``ctx`` is built once per call by
``context._context`` (the cluster, its topology, the version row or the reason there is none, the
rendered connector configs). Nothing is kept between calls. The rules live by domain:

- ``release``: the version row, the image tag, engine value types, recipe flags;
- ``kv_transfer``: Mooncake and the offload connectors, the rendered --kv-transfer-config;
- ``memory``: HBM, pinned offload, shm and machine RAM;
- ``scheduler``: batched tokens, graph capture, speculative decoding, context length;
- ``topology``: instances on hosts, ports, drain timing.
"""

from ...plan import versions  # noqa: F401 -- rules.versions: the table the rules read (tests patch it)
from ...shared import text
from ...shared.errors import PdError
from .context import ROLES, _check_inputs, _context
from .kv_transfer import (rule_block_sizes_divide, rule_mooncake_both_sides, rule_mooncake_connector_name,
                          rule_offloading_connector_placement, rule_offloading_usable,
                          rule_prefill_tp_ge_decode_tp, rule_recompute_connector_placement,
                          rule_recompute_scheduler_placement, rule_rendered_kv_transfer_config)
from .memory import (DEFAULT_RAM_RESERVE_BYTES, GMU_ERROR, GMU_PRODUCTION, GMU_WARN, rule_gpu_memory_utilization,
                     rule_host_ram, rule_offload_bytes, rule_shm_vs_pinned, rule_weights_fit)
from .release import (OFFICIAL_IMAGE, machine_npus, rule_engine_types, rule_hybrid_kv_manager, rule_image_tag,
                      rule_recipe_flags, rule_version_known)
from .scheduler import (GRAPH_CAPTURE_CAP, rule_batched_tokens_danger, rule_batched_tokens_vs_prompt,
                        rule_decode_batched_tokens, rule_decode_graph_capture, rule_max_model_len,
                        rule_partial_prefills, rule_retention_interval, rule_speculative_agree)
from .topology import (PROXY_WAITING_RETRY_DEFAULT_S, rule_drain_timing, rule_kv_port_ranges, rule_port_windows,
                       rule_ports_unique, rule_topology_fit)

#: The rules, run in this order by check_cluster.
RULES = (
    rule_version_known,
    rule_engine_types,
    rule_mooncake_connector_name,
    rule_mooncake_both_sides,
    rule_recompute_scheduler_placement,
    rule_recompute_connector_placement,
    rule_offloading_connector_placement,
    rule_offloading_usable,
    rule_offload_bytes,
    rule_gpu_memory_utilization,
    rule_batched_tokens_vs_prompt,
    rule_batched_tokens_danger,
    rule_retention_interval,
    rule_hybrid_kv_manager,
    rule_rendered_kv_transfer_config,
    rule_prefill_tp_ge_decode_tp,
    rule_block_sizes_divide,
    rule_kv_port_ranges,
    rule_port_windows,
    rule_shm_vs_pinned,
    rule_host_ram,
    rule_weights_fit,
    rule_max_model_len,
    rule_decode_batched_tokens,
    rule_decode_graph_capture,
    rule_speculative_agree,
    rule_recipe_flags,
    rule_image_tag,
    rule_partial_prefills,
    rule_drain_timing,
    rule_topology_fit,
    rule_ports_unique,
)


def check_cluster(cluster, topo, specs=None, ram_reserve_bytes=None):
    """Return every violation of one normalized cluster and its topology (list of dicts).

    ``specs`` (optional) are the cluster's rank launch specs; when given, the connector configs,
    shm and pinned bytes are checked as rendered there, otherwise they are rendered here from the
    same builders. ``ram_reserve_bytes`` is the RAM kept free beside pinned offload on every host;
    None uses each host record's ``ram_reserve_bytes`` and else 64GiB (DEFAULT_RAM_RESERVE_BYTES).
    Raises PdError only when the inputs are not the normalized structures at all.
    """
    _check_inputs(cluster, topo, specs, ram_reserve_bytes)
    ctx = _context(cluster, topo, specs, ram_reserve_bytes)
    out = []
    for rule in RULES:
        out.extend(rule(ctx))
    return out


def format_violation(v):
    """One line for a violation: ``ERROR cluster_a/prefill: field: what is wrong — what to do``."""
    where = "pd_format_violation"
    if not isinstance(v, dict):
        raise PdError(where, "violation", f"expected a violation dict, got {type(v).__name__}",
                      "pass one item of pd_check_cluster's result")
    missing = [k for k in ("level", "where", "field", "message") if k not in v]
    if missing:
        raise PdError(where, "violation", f"missing key(s) {', '.join(missing)}",
                      "pass one item of pd_check_cluster's result")
    # names as plugin_utils.text.shown prints them (b-d1\u200b), no invisible character anywhere
    line = f"{str(v['level']).upper()} {text.shown(v['where'])}: {text.shown(v['field'])}: {text.visible(v['message'])}"
    if v.get("fix"):
        line += f" — {text.visible(v['fix'])}"
    return line


def has_errors(vs):
    """True when any violation of ``vs`` has level "error" (errors block the deploy)."""
    if not isinstance(vs, list):
        raise PdError("pd_has_errors", "violations", f"expected a list, got {type(vs).__name__}",
                      "pass the list pd_check_cluster returns")
    return any(isinstance(v, dict) and v.get("level") == "error" for v in vs)
