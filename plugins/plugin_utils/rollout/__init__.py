"""Rollout: what to roll and in which order (clusters, batches, waves, locks), which containers to start,
replace or keep, and the known failures found in their logs."""
