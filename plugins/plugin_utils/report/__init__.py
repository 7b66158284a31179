"""Report: the deploy summary written after a rollout."""
