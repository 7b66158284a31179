"""Rollout: which containers to start, replace or keep, and the known failures found in their logs."""
