# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""pd-deploy core library: pure functions behind the Ansible filter plugins.

Everything here is plain Python (no Ansible objects in, plain data out) so that it can be unit
tested directly and reused by the playbooks through ``plugins/filter/pd.py`` and the action plugins. It
is the collection's ``plugin_utils``: controller-side only (no module shipped to the hosts imports it),
imported as ``ansible_collections.pd.deploy.plugins.plugin_utils.<stage>``.

Grouped by the stage of the pipeline that uses it:

- ``shared``: errors, the package data files (``data/``, ``schemas/``), text and size helpers;
- ``plan``: the inventory shape check (``shape``), cluster normalization and topology (``model``),
  launch specs (``launch``), connectors, versions, capacity, ports and the fleet plan
  (``fleet.plan_fleet``);
- ``validate``: what the plan refuses or warns about: rules (one module per domain), limits,
  guards, inventory, secrets,
  every problem one ``violation.Violation`` dict (the plan's own topology problems too);
- ``hostcheck``: prechecks, NPU network checks and compatibility of what runs on the hosts;
- ``rollout``: what to roll and in which order, container decisions, known failures in the logs;
- ``report``: the deploy summary;
- ``ops``: the operator's workflow after a deploy (health, baseline, capacity, gate, tuning).
"""
