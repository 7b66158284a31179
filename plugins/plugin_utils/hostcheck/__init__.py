"""Host checks: what the prechecks decide from the facts the probe gathered on each host."""
