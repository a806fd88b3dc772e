"""Pure decisions: (spec, observed state, signals) in, desired state out. No I/O here.

- `reconcile`: spec + observed replicas -> the reconcile plan (desired replicas, drains).
- `autoscaler`, `autoscaler_spec`: signals + history -> desired replicas per role, with the reason.
- `signals`: parse `/metrics` samples, keep the scrape log, aggregate per role over a window.
- `scaledown`: which replicas to drain, and when a drain is done.
- `router_config`: the router's config (endpoints, roles, states, policy) for a desired state.
- `engine_args`, `lmcache`: an engine's command line and environment for a role.
"""
