"""The cache-aware default keeps a conversation where its prefix went, at the shipped defaults.

The live replay (bench/router_cache_hits.py) spread shared prefixes over 1.3 backends while
its backends still cached them: the approximate index (20000 blocks of 64 B, 1.28 MB of
prompt text per endpoint) forgot a conversation before the engine did, and its next turn was
placed by load anew. These tests pin the rule the default keeps instead: the index remembers
`max_blocks_per_endpoint` blocks per endpoint exactly, and that is 4 MiB of text by default.
"""

import random

from kvfleet_router.config import RouterConfig
from kvfleet_router.prefix_index import ApproxPrefixIndex
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

SYSTEM = "<system> " + "you are a helpful assistant. " * 17  # 502 B, in every prompt


def default_core(n: int = 4, seed: int = 0) -> RouterCore:
    cfg = RouterConfig.from_dict({"endpoints": [
        {"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}"} for i in range(n)]})
    return RouterCore(cfg, rng=random.Random(seed))


def text(key: int, num_bytes: int) -> str:
    rng = random.Random(key)
    words = (" alpha", " beta", " gamma", " delta", " kv", " cache", " turn")
    return (f"<{key}>" + "".join(rng.choices(words, k=num_bytes // 3)))[:num_bytes]


def send(c: RouterCore, prompt: str, held: list | None = None) -> str:
    """Route and start one request; it finishes at once unless `held` keeps it in flight."""
    routed = c.route(RequestInfo(prompt_text=prompt), "unified", now=1.0)
    e = c.start(routed)
    assert e is not None
    if held is None:
        c.finish(e)
    else:
        held.append(e)
    return e.name


def test_default_index_holds_4_mib_of_prompt_text_per_endpoint():
    cfg = RouterConfig()
    assert cfg.policy.name == "cache-aware"
    assert cfg.prefix.block_bytes * cfg.prefix.max_blocks_per_endpoint == 4 << 20
    assert ApproxPrefixIndex().max_blocks_per_endpoint == cfg.prefix.max_blocks_per_endpoint


def test_default_index_keeps_a_chain_up_to_the_bound_and_cuts_its_tail_one_block_past_it():
    c = default_core(n=1)
    bound = c.cfg.prefix.max_blocks_per_endpoint
    chain = c.approx.hash_text(SYSTEM + text(1, 64 * 100))
    c.approx.record("e0", chain)
    filler = c.approx.hash_text(text(2, 64 * (bound - len(chain))))
    c.approx.record("e0", filler)  # exactly at the bound: the chain is whole
    assert c.approx.num_blocks("e0") == bound
    assert c.approx.match(chain) == {"e0": len(chain)}
    c.approx.record("e0", c.approx.hash_text(text(3, 64)))  # one block past it
    assert c.approx.num_blocks("e0") == bound
    assert c.approx.match(chain) == {"e0": len(chain) - 1}  # the tail goes first


def test_every_later_turn_goes_where_its_conversation_started():
    """120 conversations whose 48 KiB first turns run together (placed by load: 1.5 MB per
    endpoint, more than the old 20000-block index held), then every second turn, oldest
    first, one at a time. Each must land on its first turn's endpoint: one backend per
    shared prefix."""
    c = default_core()
    firsts = [SYSTEM + text(k, 48 << 10) for k in range(120)]
    held: list = []
    where = [send(c, p, held) for p in firsts]  # all in flight together: spread by load
    assert sorted(where.count(f"e{i}") for i in range(4)) == [30, 30, 30, 30]
    for e in held:
        c.finish(e)
    moved = [k for k, p in enumerate(firsts) if send(c, p + text(1000 + k, 1024)) != where[k]]
    assert moved == []
