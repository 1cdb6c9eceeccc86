"""vtalloc.server: the per-node service that owns physical pages and leases them to clients."""
