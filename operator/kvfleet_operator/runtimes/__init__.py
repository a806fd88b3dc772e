"""Runtimes implement the control loop's ports (`kvfleet_operator.loop.ports`).

- `local/`: the local runtime (`kvfleet up`): replicas as processes, `state.json`, the
  terminal's progress.
- `kubernetes/`: the Kubernetes runtime: pure manifest builders (`build/`), the ports over
  the Kubernetes API (`ports/`), and the kopf wiring that drives them (`handlers.py`).
- Shared by both: `router_control` (the router's admin API over HTTP), `metrics_sources`
  (scrape each replica or ask Prometheus), `metrics_server` (the operator's own /metrics).

The simulator's ports live in `kvfleet_sim.ports`.
"""
