"""Every numeric field of the router config has a finite, sane range, and a value outside
it is refused with the field's path and the range.

The table is derived from the config's JSON Schema (pydantic builds it from the same field
declarations that validate): a new int/float field without a range fails
`test_every_numeric_field_has_a_range`, and every field with one is probed below, at and
beyond both ends, with NaN and the infinities."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from kvfleet_router.config import ConfigError, RouterConfig

ENDPOINT = {"name": "e0", "url": "http://127.0.0.1:1"}
SCHEMA = RouterConfig.json_schema()


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return SCHEMA["$defs"][ref.rsplit("/", 1)[-1]] if ref else node


def _walk(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema node) of every scalar field below `node`, nested configs included."""
    out = []
    for name, sub in node["properties"].items():
        sub = _resolve(sub)
        fpath = f"{path}.{name}" if path else name
        if "properties" in sub:
            out += _walk(sub, fpath)
        elif sub.get("type") == "array" and "properties" in _resolve(sub["items"]):
            out += _walk(_resolve(sub["items"]), f"{fpath}[0]")
        else:
            out.append((fpath, sub))
    return out


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    is_low_open: bool
    is_int: bool

    def __str__(self) -> str:
        low, high = (int(x) if float(x).is_integer() else x for x in (self.low, self.high))
        return f"{'(' if self.is_low_open else '['}{low}, {high}]"

    def contains(self, value: float) -> bool:
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.is_low_open else value >= self.low


def _range(node: dict[str, Any]) -> Range | None:
    if "maximum" not in node or not ("minimum" in node or "exclusiveMinimum" in node):
        return None
    is_open = "exclusiveMinimum" in node
    low = node["exclusiveMinimum"] if is_open else node["minimum"]
    return Range(low, node["maximum"], is_open, node["type"] == "integer")


FIELDS = _walk(SCHEMA, "")
NUMERIC = [(path, node) for path, node in FIELDS if node.get("type") in ("integer", "number")]


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


@pytest.mark.parametrize("path, node", NUMERIC, ids=[p for p, _ in NUMERIC])
def test_every_numeric_field_has_a_range(path, node):
    rng = _range(node)
    assert rng is not None, f"{path} has no range: declare it with Field(ge=..., le=...)"
    assert math.isfinite(rng.low) and math.isfinite(rng.high) and rng.low < rng.high
    assert rng.contains(node["default"]), f"{path}: default {node['default']} outside {rng}"


def _bad_values(rng: Range) -> list[Any]:
    step = 1 if rng.is_int else max(abs(rng.high), 1) * 1e-6
    below = rng.low if rng.is_low_open else rng.low - (1 if rng.is_int else
                                                        max(abs(rng.low), 1e-3))
    out = [below, rng.high + step, 10**30, -(10**30)]
    if rng.is_int:
        out = [int(v) for v in out]
    if not rng.is_int:
        out += [math.nan, math.inf, -math.inf]
    return out


CASES = [(path, rng, v) for path, node in NUMERIC if (rng := _range(node)) is not None
         for v in _bad_values(rng)]


@pytest.mark.parametrize("path, rng, value", CASES,
                         ids=[f"{p}={v!r}" for p, _, v in CASES])
def test_out_of_range_is_refused_with_field_and_range(path, rng, value):
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict(_data(path, value))
    message = str(err.value)
    what = "an integer" if rng.is_int else "a finite number"
    assert message.startswith(f"{path}: must be {what} in {rng}, got "), message


@pytest.mark.parametrize("path, node", NUMERIC, ids=[p for p, _ in NUMERIC])
def test_both_ends_of_a_range_are_not_refused_for_that_field(path, node):
    rng = _range(node)
    if rng is None:
        pytest.fail(f"{path} has no range")
    ends = [rng.high] if rng.is_low_open else [rng.low, rng.high]
    for end in ends:
        value = int(end) if rng.is_int else end
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
