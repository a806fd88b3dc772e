"""What the peer-prefix server tests share: request bodies, the hint, metric reads."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.prefix_share import chained_hashes

TOKEN = "peer-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOCK_SIZE = 16


def body(model: str, prompt: list[int], max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **extra}


def hint(url: str, prompt: list[int], num_blocks: int) -> dict[str, Any]:
    """kv_transfer_params naming `url` as holding the prompt's first num_blocks blocks."""
    return pp.peer_prefix_hint(url, chained_hashes(prompt, BLOCK_SIZE, num_blocks))


async def complete(session: aiohttp.ClientSession, url: str,
                   payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(url + "/v1/completions", json=payload) as resp:
        return resp.status, await resp.json()


async def samples(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of /metrics by its full name and labels."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def outcome(all_samples: dict[str, float], model: str, name: str) -> float:
    return all_samples[f'{pp.PEER_FETCH}_total{{{contract.MODEL_LABEL}="{model}",'
                       f'{pp.OUTCOME_LABEL}="{name}"}}']


def counter(all_samples: dict[str, float], model: str, family: str) -> float:
    return all_samples[f'{family}_total{{{contract.MODEL_LABEL}="{model}"}}']


async def root_chain(session: aiohttp.ClientSession, url: str) -> tuple[list[int], list[int]]:
    """(hashes, token ids) of the chain of cached blocks from the root, as a router's
    precise index learns them: from the replica's /v1/kv_events backlog (the first prompt
    a fresh replica computed)."""
    stored: dict[int | None, tuple[int, list[int]]] = {}  # parent -> (hash, tokens)
    async with session.get(url + "/v1/kv_events?since=-1", headers=AUTH) as resp:
        assert resp.status == 200
        while True:
            try:
                line = await asyncio.wait_for(resp.content.readline(), 1.0)
            except TimeoutError:
                break
            event = json.loads(line)
            if event["type"] == "BlockStored":
                parent, size = event["parent_block_hash"], event["block_size"]
                for i, block_hash in enumerate(event["block_hashes"]):
                    stored.setdefault(parent, (block_hash, event["token_ids"][i * size:
                                                                          (i + 1) * size]))
                    parent = block_hash
    hashes, tokens = [], []
    parent = None
    while parent in stored:
        block_hash, block_tokens = stored[parent]
        hashes.append(block_hash)
        tokens += block_tokens
        parent = block_hash
    return hashes, tokens
