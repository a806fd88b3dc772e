"""kvfleet_router: the cache-aware router in front of engine replicas (see router/README.md).

Pure parts, no I/O (the simulator uses policies/ and endpoint today):
  config (schema kvfleet.io/router/v1), endpoint, registry, breaker, prefix_index,
  policies/ (filters, scorers, pickers, named policies), router_core (route + record),
  scorers_feedback (what an exchange teaches), pd_deciders (when P/D runs a prefill leg),
  pd_plan (one request's P/D legs and peer hint; the simulator runs it too).
Pieces of the server, each built from what it uses (app.py wires them, nothing else):
  feedback (HealthFeedback), dispatch (queue + retries), pd (Disaggregator), config_store,
  admin (AdminAPI), front (OpenAI, /health, /metrics handlers), proxy (Forwarder),
  wait_queue, metrics, signals, health, kv_events; cli (`kvfleet router`).
"""
