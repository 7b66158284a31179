"""Plan: the normalized cluster, its launch specs, connectors, versions, capacity, ports, the fleet plan."""
