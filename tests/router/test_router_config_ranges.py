"""Every numeric field of the router config has a finite, sane range (config.num), and a
value outside it is refused with the field's path and the range.

The table is derived from the config dataclasses themselves: a new int/float field
without a range fails `test_every_numeric_field_has_a_range`, and every field with one
is probed below, at and beyond both ends, with NaN and the infinities."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from kvfleet_router import config as C
from kvfleet_router.config import ConfigError, Range, RouterConfig

ENDPOINT = {"name": "e0", "url": "http://127.0.0.1:1"}


def _walk(cls: type, path: str) -> list[tuple[str, dataclasses.Field[Any]]]:
    """(dotted path, field) of every scalar field below `cls`, nested configs included."""
    out = []
    for f in dataclasses.fields(cls):
        fpath = f"{path}.{f.name}" if path else f.name
        if f.name == "endpoints":
            out += _walk(C.EndpointConfig, "endpoints[0]")
        elif f.name in C._NESTED and str(f.type) not in ("int", "float"):
            out += _walk(C._NESTED[f.name], fpath)
        else:
            out.append((fpath, f))
    return out


FIELDS = _walk(RouterConfig, "")
NUMERIC = [(path, f) for path, f in FIELDS if str(f.type) in ("int", "float")]


def _data(path: str, value: Any) -> dict[str, Any]:
    """A config document that sets `path` (and is otherwise the default)."""
    data: dict[str, Any] = {}
    if path.startswith("endpoints[0]."):
        data["endpoints"] = [{**ENDPOINT, path.split(".", 1)[1]: value}]
        return data
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def test_the_table_covers_the_config():
    assert len(NUMERIC) >= 30
    assert {"queue.timeout_s", "health.probe_interval_s", "queue.max_size",
            "retries.max_attempts", "limits.max_body_bytes", "timeouts.first_byte_s",
            "limits.body_read_timeout_s", "limits.max_uploads_per_client",
            "endpoints[0].capacity", "version"} <= {p for p, _ in NUMERIC}


@pytest.mark.parametrize("path, f", NUMERIC, ids=[p for p, _ in NUMERIC])
def test_every_numeric_field_has_a_range(path, f):
    rng = f.metadata.get("range")
    assert isinstance(rng, Range), f"{path} has no range: declare it with config.num()"
    assert math.isfinite(rng.low) and math.isfinite(rng.high) and rng.low < rng.high
    assert rng.contains(f.default), f"{path}: default {f.default} outside {rng}"


def _bad_values(f: dataclasses.Field[Any]) -> list[Any]:
    rng: Range | None = f.metadata.get("range")
    if rng is None:  # test_every_numeric_field_has_a_range names it
        return []
    is_int = str(f.type) == "int"
    step = 1 if is_int else max(abs(rng.high), 1) * 1e-6
    below = rng.low if rng.is_low_open else rng.low - (1 if is_int else max(abs(rng.low), 1e-3))
    out = [below, rng.high + step, 10**30, -(10**30)]
    if is_int:
        out = [int(v) for v in out]
    if not is_int:
        out += [math.nan, math.inf, -math.inf]
    return out


CASES = [(path, f, v) for path, f in NUMERIC for v in _bad_values(f)]


@pytest.mark.parametrize("path, f, value", CASES,
                         ids=[f"{p}={v!r}" for p, _, v in CASES])
def test_out_of_range_is_refused_with_field_and_range(path, f, value):
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict(_data(path, value))
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert str(f.metadata["range"]) in message, message


@pytest.mark.parametrize("path, f", NUMERIC, ids=[p for p, _ in NUMERIC])
def test_both_ends_of_a_range_are_not_refused_for_that_field(path, f):
    rng: Range | None = f.metadata.get("range")
    if rng is None:
        pytest.fail(f"{path} has no range")
    ends = [rng.high] if rng.is_low_open else [rng.low, rng.high]
    for end in ends:
        value = int(end) if str(f.type) == "int" else end
        try:
            RouterConfig.from_dict(_data(path, value))
        except ConfigError as exc:  # a relation to another field may object, not the range
            assert str(rng) not in str(exc) and "must be >=" in str(exc), exc


@pytest.mark.parametrize("weights", [{"prefix": 0, "queue": 0, "kv": 0}, {"prefix": 0}, {}])
def test_all_zero_weights_are_refused(weights):
    with pytest.raises(ConfigError, match=r"^policy\.weights: at least one weight"):
        RouterConfig.from_dict({"policy": {"weights": weights}})


@pytest.mark.parametrize("value", [-1, 1001, math.nan, math.inf, 10**400])
def test_a_weight_out_of_range_is_refused(value):
    with pytest.raises(ConfigError, match=r"^policy\.weights\.prefix: must be a"):
        RouterConfig.from_dict({"policy": {"weights": {"prefix": value, "queue": 1}}})


def test_the_misleading_nan_message_is_gone():
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict({"queue": {"timeout_s": math.nan}})
    assert str(err.value) == "queue.timeout_s: must be a finite number in [0, 3600], got nan"
