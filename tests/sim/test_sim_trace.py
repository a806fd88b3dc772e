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
