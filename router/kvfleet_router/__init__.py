"""kvfleet_router: the cache-aware router in front of engine replicas (see router/README.md).

Pure parts, importable without I/O (benchmarks and the simulator use them):
  config (schema kvfleet.io/router/v1), endpoint, registry, breaker, prefix_index,
  policies/ (filters, scorers, pickers, named policies), router_core (route + record).
I/O at the edges: app (aiohttp), proxy, dispatch (queue + retries), pd, admin, signals,
  health, kv_events, metrics, cli (`kvfleet router`).
"""
