"""Runtimes implement the control loop's ports (`kvfleet_operator.loop.ports`).

The local runtime (`kvfleet up`): `local` (replicas as processes), `router_control` (the
router's admin API over HTTP), `metrics_sources` (scrape or Prometheus), `local_store`
(`state.json`), plus `progress` for the terminal. The simulator's ports live in
`kvfleet_sim.ports`. `kubernetes/` is the Kubernetes runtime: the manifest builders
(`kvfleet operator render`) and the ports over the Kubernetes API that `kvfleet operator
run` (kopf, `handlers.py`) drives.
"""
