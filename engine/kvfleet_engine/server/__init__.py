"""The engine's aiohttp server: OpenAI API, /metrics, KV events, KV transfer and P/D.

`serve.serve` runs one replica; `build` turns CLI arguments into an engine and settings.
"""
