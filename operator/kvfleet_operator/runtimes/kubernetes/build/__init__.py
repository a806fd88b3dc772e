"""Pure manifest builders: one InferencePool -> its child objects.

Nothing here does I/O. `build_children(pool, tokens=..., image=...)` returns every child
the operator owns for a pool, in apply order; each kind has its own module:

| module | builds |
|---|---|
| `secret.py` | the router admin token and the engine token Secrets |
| `configmap.py` | the router's bootstrap config (`decide.router_config.build_router_config`) |
| `network_policy.py` | the engines' ingress policy (router, operator, pool peers) |
| `service.py` | a headless Service per engine role, the router's, the routers' peers' |
| `pdb.py` | a PodDisruptionBudget per engine role and for the router |
| `deployment.py` | an engine Deployment per role, the router Deployment |

The pods inside the Deployments come from `engine_pod.py` and `router_pod.py`, over
`security.py` (the restricted securityContext) and `model_source.py` (volumes, mounts and
env per `model.source` scheme). `meta.py` holds names, labels, selectors and owner
references; `options.py` the build inputs that are not in the spec. `kvfleet operator
render` and `manifests` (`cli/operator_cmd.py`) print them.
"""
