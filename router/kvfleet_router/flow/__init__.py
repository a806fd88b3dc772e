"""Flow control's pure parts: who is asking, which band, who goes next, when to queue.

- `tenants.py`: a request's tenant -> (band, weight) from `flow_control`; the effective
  band and the `priority` forwarded to the engine; capped tenant metric labels.
- `service.py`: attained service per tenant (input + output tokens, decayed).
- `fair_queue.py`: the queued tickets: bands in order, weighted least attained service
  between the tenants of a band, earliest deadline (FCFS without an SLO) inside a tenant.
- `saturation.py`: may a request be dispatched now (a stale scrape is saturated).

No asyncio, no clocks of their own (`now` is passed in): `wait_queue.py` and
`dispatch.py` are the asyncio edge.
"""
