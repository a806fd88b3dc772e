"""kvfleet_sim.trace: slicing and compressing the Azure CSV; bad files get one-line errors."""

import pytest
from kvfleet_sim.trace import TraceError, load_azure_csv

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path, rows, header=HEADER):
    path = tmp_path / "t.csv"
    path.write_text(header + "".join(rows))
    return path


def test_slice_and_compress(tmp_path):
    rows = [f"2023-11-16 18:00:{s:02d}.5000000,{100 + s},{s + 1}\n" for s in range(0, 40, 5)]
    path = write(tmp_path, rows)
    reqs = load_azure_csv(path, start_s=10, duration_s=20, compress=2)
    # seconds 10, 15, 20, 25 of the trace -> 0, 2.5, 5, 7.5 after compression
    assert [r.t for r in reqs] == [0.0, 2.5, 5.0, 7.5]
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in reqs][0] == (110, 11)


def test_real_trace_slice_has_the_published_shape():
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]  # the folder holding the checkout and shared/
    path = root / "shared" / "traces" / "azure_llm_2023_conv.csv"
    if not path.exists():
        pytest.skip("shared traces not present")
    reqs = load_azure_csv(path, start_s=1800, duration_s=60)
    assert 300 < len(reqs) < 700  # ~5-8 requests/s in that minute
    assert all(0 <= r.t < 60 for r in reqs)


@pytest.mark.parametrize(
    "content,match",
    [
        ("a,b,c\n1,2,3\n", "not an Azure LLM trace"),
        (HEADER + "yesterday,1,2\n", ":2: malformed row"),
        (HEADER + "2023-11-16 18:00:00.0,1\n", ":2: malformed row"),
        (HEADER, "no requests"),
    ],
)
def test_bad_files(tmp_path, content, match):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=match):
        load_azure_csv(path)


def test_missing_file_and_bad_args(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_azure_csv(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="compress"):
        load_azure_csv(tmp_path / "nope.csv", compress=0)


# --- Mooncake, rate multiplication, prompts ---

from kvfleet_sim.trace import (  # noqa: E402
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    block_tokens,
    load_mooncake,
    load_trace,
    multiply_rate,
    prompt_tokens,
)


def write_mooncake(tmp_path, rows):
    import json

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 2000, "input_length": 1600, "output_length": 7, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 4000, "input_length": 10, "output_length": 1, "hash_ids": [9]},
    {"timestamp": 9000, "input_length": 600, "output_length": 2, "hash_ids": [0, 4]},
]


def test_mooncake_slice_compress_and_format_detection(tmp_path):
    path = write_mooncake(tmp_path, MOONCAKE_ROWS)
    reqs = load_mooncake(path, start_s=2, duration_s=5, compress=2)
    assert [(r.t, r.num_prompt_tokens, r.hash_ids) for r in reqs] == [
        (0.0, 1600, (0, 1, 2, 3)), (1.0, 10, (9,))]
    assert load_trace(path, 0, 100) == load_mooncake(path, 0, 100)


def test_hash_ids_expand_into_shared_token_prefixes(tmp_path):
    a, b, c, d = load_mooncake(write_mooncake(tmp_path, MOONCAKE_ROWS))
    pa, pb, pd = (prompt_tokens(r, i, 10_000) for i, r in ((0, a), (1, b), (3, d)))
    assert len(pa) == 1000 and len(pb) == 1600 and len(block_tokens(7)) == MOONCAKE_BLOCK_TOKENS
    assert pb[:1000] == pa  # the same ids: the same tokens, so a real shared prefix
    assert pd[:512] == pa[:512] and pd[512:600] != pb[512:600]  # shares only block 0
    assert prompt_tokens(b, 1, 700) == pb[:700]  # clipped to fit
    assert block_tokens(5) == block_tokens(5) != block_tokens(6)
    assert all(0 <= t < 256 for t in pb)
    # Requests without hash ids (Azure) get their own blocks: no accidental sharing.
    x, y = TraceRequest(0, 600, 1), TraceRequest(1, 600, 1)
    assert prompt_tokens(x, 0, 1000)[:16] != prompt_tokens(y, 1, 1000)[:16]
    assert prompt_tokens(x, 0, 1000) == prompt_tokens(x, 0, 1000)


def test_rate_multiplier_is_exact_spread_and_gives_copies_their_own_ids():
    reqs = [TraceRequest(float(t), 100, 1, (0, t + 1)) for t in range(10)]
    doubled = multiply_rate(reqs, 2.0)
    assert len(doubled) == 20 and [r.t for r in doubled[:4]] == [0.0, 0.5, 1.0, 1.5]
    assert doubled[0].hash_ids == (0, 1) and doubled[1].hash_ids == (11, 12)
    assert len(multiply_rate(reqs, 0.5)) == 5 and len(multiply_rate(reqs, 1.5)) == 15
    assert multiply_rate(reqs, 1.0) == reqs
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e6):
        with pytest.raises(TraceError, match="rate"):
            multiply_rate(reqs, bad)
    with pytest.raises(TraceError, match="no requests"):
        multiply_rate(reqs[:1], 0.5)


@pytest.mark.parametrize(
    "line,match",
    [
        ('{"timestamp": 0, "input_length": 10}', ":1: malformed"),
        ("not json", ":1: malformed"),
        ('{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}',
         ":1: malformed"),  # 2,000 tokens need 4 blocks
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}',
         ":1: malformed"),
    ],
)
def test_bad_mooncake_rows(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceError, match=match):
        load_mooncake(path)


def test_mooncake_empty_slice_and_binary_file(tmp_path):
    path = write_mooncake(tmp_path, MOONCAKE_ROWS)
    with pytest.raises(TraceError, match="no requests in"):
        load_mooncake(path, start_s=100, duration_s=5)
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"{\xff\xfe\x00")
    with pytest.raises(TraceError):
        load_trace(junk)


def test_real_mooncake_trace_shape():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip("shared traces not present")
    reqs = load_mooncake(path, 0, 3600)
    assert len(reqs) == 12031 and 3500 < reqs[-1].t < 3600
