"""Validate: what the plan refuses or warns about (rules by domain, limits, guards, inventory, secrets)."""
