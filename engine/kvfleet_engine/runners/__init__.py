"""Runners behind `core.runner_base.Runner`: `torch_runner` (real weights, paged KV) and
`sim_runner` (time from a `cost_model` profile); `calibrate` fits profiles to a runner."""
