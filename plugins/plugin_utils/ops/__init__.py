# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The operator's workflow after a deploy (DOMAIN.md §5-§7): read signals, judge them, act on one knob.

One module per step, plain functions; those that ``playbooks/health_check.yml``, ``baseline.yml``,
``capacity_report.yml``, ``token_gate.yml``, ``tune.yml`` and ``monitoring.yml`` apply are the ``pd_*``
filters of ``plugins/filter/pd.py``:

- ``metrics``: ``parse_metrics`` reads a vLLM ``/metrics`` page, ``metrics_window`` the change
  between two scrapes;
- ``diagnosis``: ``diagnose`` applies the article's pitfall table to a rank's scrapes (and its log),
  ``verdict`` sums findings up; ``health_ranks`` / ``health_clusters`` adapt Ansible loop results;
- ``gate``: ``token_gate`` compares two answer sets token by token;
- ``tuning``: ``one_change`` insists that exactly one parameter changed;
- ``baseline``: ``baseline_report`` fits bare-engine start-up logs at two max-model-len values;
- ``capacity_report``: ``capacity_report`` and ``capacity_chart_svg``;
- ``monitoring``: ``prometheus_scrape_config`` and ``grafana_dashboard``;
- ``common``: what the steps share (model family bands, the normalized cluster);
- ``logparse``: vLLM's start-up KV cache lines read into bytes per token (the baseline step, the logparse filters);
- ``remove``: ``remove_hosts_plan`` says which instances removing hosts takes, or refuses it
  (``playbooks/remove_hosts.yml``).

Nothing here talks to a host; no module level mutable state. Bad input raises ``PdError``.
"""

from . import baseline, capacity_report, common, diagnosis, gate, metrics, monitoring, remove, tuning

#: The workflow's modules in the operator's order.
__all__ = ["common", "metrics", "diagnosis", "gate", "tuning", "baseline", "capacity_report", "monitoring", "remove"]
