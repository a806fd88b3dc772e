"""The engine core: requests, blocks, the scheduler and the step loop. No torch, no aiohttp.

`engine.LLMEngine` drives a `runner_base.Runner`; everything here is plain Python, so
the simulator and the tests run it without a model.
"""
