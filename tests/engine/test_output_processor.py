"""Stop decisions and incremental detokenization, pure."""

import pytest
from kvfleet_engine.core.output_processor import IncrementalDetokenizer, check_stop_token
from kvfleet_engine.core.sampling_params import SamplingParams


class Utf8Bytes:
    eos_token_ids = [256]

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode(self, text):
        return list(text.encode())


def feed(detok, text, final_at_end=True):
    ids = list(text.encode())
    chunks = []
    for i, t in enumerate(ids):
        new, stopped = detok.add(t, is_final=final_at_end and i == len(ids) - 1)
        chunks.append(new)
        if stopped:
            return chunks, True
    return chunks, False


@pytest.mark.parametrize("token, n_out, params, expected", [
    (5, 1, SamplingParams(max_tokens=3), None),
    (5, 3, SamplingParams(max_tokens=3), "length"),
    (9, 1, SamplingParams(stop_token_ids=[9]), "stop"),
    (2, 1, SamplingParams(), "stop"),  # eos
    (2, 1, SamplingParams(ignore_eos=True), None),
])
def test_check_stop_token(token, n_out, params, expected):
    assert check_stop_token(token, n_out, 10, params, {2}, max_model_len=100) == expected


def test_check_stop_token_at_max_model_len():
    assert check_stop_token(5, 1, 100, SamplingParams(max_tokens=50), (), 100) == "length"


def test_multibyte_characters_are_never_split():
    detok = IncrementalDetokenizer(Utf8Bytes(), [])
    chunks, _ = feed(detok, "aé€😀b")
    assert "".join(chunks) == "aé€😀b"
    assert all("\ufffd" not in c for c in chunks)
    assert chunks[1] == ""  # first byte of é alone is withheld


def test_stop_string_cuts_text_and_is_never_streamed_in_part():
    detok = IncrementalDetokenizer(Utf8Bytes(), ["STOP", "xyz"])
    chunks, stopped = feed(detok, "hello STOP world", final_at_end=False)
    assert stopped and "".join(chunks) == "hello " == detok.sent_text()
    assert all("S" not in c for c in chunks)


def test_partial_stop_string_is_released_when_it_does_not_complete():
    detok = IncrementalDetokenizer(Utf8Bytes(), ["STOP"])
    chunks, stopped = feed(detok, "aSTObSTO")
    assert not stopped and "".join(chunks) == "aSTObSTO"  # final flush releases the hold


def test_stop_string_spanning_tokens_and_earliest_match_wins():
    detok = IncrementalDetokenizer(Utf8Bytes(), ["cd", "bcde"])
    chunks, stopped = feed(detok, "abcdef", final_at_end=False)
    assert stopped and detok.sent_text() == "ab"


def test_stop_token_is_not_decoded():
    detok = IncrementalDetokenizer(Utf8Bytes(), [])
    detok.add(ord("a"), is_final=False)
    new, stopped = detok.add(None, is_final=True)
    assert new == "" and not stopped and detok.sent_text() == "a"
