# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every step of the operator's workflow reads: a model family's expected KV footprint
(plugins/plugin_utils/data/models.yml), the normalized cluster, and byte figures for the reports."""

from collections.abc import Mapping

from ..plan import model
from ..shared import datafiles, sizes
from ..shared.errors import PdError

DEFAULT_FAMILY = "deepseek_v4_flash"


def models():
    """A fresh copy of plugins/plugin_utils/data/models.yml (expected KV footprint per model family)."""
    return datafiles.yaml_data("models.yml")


def _family(family, where):
    data = models()
    name = family or DEFAULT_FAMILY
    if name not in data:
        raise PdError(where, "family", f"{name!r} is not in plugins/plugin_utils/data/models.yml",
                      f"use one of {', '.join(sorted(data))} (pd_cluster.model.family) or add the family there")
    return data[name]


def model_band(family=None, override=None):
    """Expected marginal KV bytes per token per worker of a model family: ``{min, max, source}``.

    ``override`` (a dict with the same keys, e.g. the ``pd_ops_kv_band`` variable) replaces the
    data file's band; its ``source`` must say where the numbers come from.
    """
    where = "pd_model_band"
    if override:
        if not isinstance(override, Mapping):
            raise PdError(where, "override", f"{type(override).__name__} is not a band",
                          "give {min: <bytes>, max: <bytes>, source: <where the numbers come from>}")
        band = {key: override.get(key) for key in ("min", "max", "source")}
        for key in ("min", "max"):
            sizes.check_number(band[key], f"override.{key}", where, low=0, low_open=True)
        if not isinstance(band["source"], str) or not band["source"].strip():
            raise PdError(where, "override.source", f"{band['source']!r} is not a source",
                          "say where the band's numbers come from (a measurement, a report, an issue)")
        if band["min"] > band["max"]:
            raise PdError(where, "override.min", f"{band['min']} is above max {band['max']}", "swap min and max")
        return band
    return dict(_family(family, where)["bytes_per_token"])


def model_estimate(family=None):
    """Configured per-request footprint estimate of a family: ``{marginal_bytes_per_token,
    fixed_bytes_per_request, source}`` (used until a baseline has measured the cluster)."""
    return dict(_family(family, "pd_model_estimate")["estimate"])


def normalized(config, where):
    """The normalized cluster of a raw ``pd_cluster`` dict (or an already normalized one)."""
    if not isinstance(config, Mapping):
        raise PdError(where, "config", f"{type(config).__name__} is not a cluster configuration",
                      "pass the cluster's pd_cluster (hostvars[host].pd_cluster)")
    if isinstance(config.get("roles"), Mapping):
        return config
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise PdError(where, "config.name", f"{name!r} is not a cluster name",
                      "pass the cluster's pd_cluster dict, whose name is its inventory group")
    return model.normalize(name, dict(config))


def normalized_cluster(config):
    """The normalized cluster (defaults merged, sizes in bytes; docs/design.md) of a ``pd_cluster`` dict."""
    return normalized(config, "pd_normalized_cluster")


def p99_request_len(cluster):
    """The business P99 request length: p99 prompt + p99 output tokens (what max-model-len should be)."""
    work = cluster["workload"]
    return work["p99_prompt_tokens"] + work["p99_output_tokens"]


def human(n):
    """A byte count as the reports print it ("1.5GiB"; "0" for none)."""
    return sizes.to_human(int(n)) if n else "0"
