# Copyright (c) 2026, the pd-deploy authors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rollout: what to roll and in which order (clusters, batches, waves, locks), which containers to start,
replace or keep, and the known failures found in their logs."""
