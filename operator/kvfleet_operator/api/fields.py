"""Declarative field rules and the generic walker that turns manifest dicts into dataclasses.

Each spec dataclass declares its checks once, as `spec_field(...)` metadata (bounds, enum,
pattern). The same metadata is compared with the CRD schema by the tests, so the Python
parser and the apiserver agree on defaults and ranges. Cross-field rules (the CRD's CEL
rules) live in each dataclass's `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any

from .errors import SpecError, join_path

# Kubernetes resource.Quantity, e.g. 500m, 4Gi, 1.5, 2e3.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@dataclass(frozen=True, slots=True)
class Rule:
    """What one field accepts. `by_cel` marks ranges the CRD checks with CEL, not the schema."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    max_items: int | None = None
    is_required: bool = False
    is_quantity: bool = False
    by_cel: bool = False
    items: Rule | None = None


def spec_field(default: Any = MISSING, *, default_factory: Any = MISSING, **rule: Any) -> Any:
    """A dataclass field with a validation Rule attached."""
    meta = {"rule": Rule(**rule)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}
    return names.get(type(value), "number" if isinstance(value, float) else type(value).__name__)


def field_rule(f: dataclasses.Field[Any]) -> Rule:
    rule = f.metadata.get("rule")
    return rule if isinstance(rule, Rule) else Rule()


Shape = tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]
_SHAPES: dict[type[Any], Shape] = {}


def shape_of(cls: type[Any]) -> Shape:
    """A dataclass's resolved type hints and its fields by camelCase key, resolved once:
    resolving costs milliseconds per pool, and the operator parses every pool often."""
    shape = _SHAPES.get(cls)
    if shape is None:
        hints = typing.get_type_hints(cls)
        shape = _SHAPES[cls] = hints, {camel(f.name): f for f in dataclasses.fields(cls)}
    return shape


def build(cls: type[Any], data: Any, path: str) -> Any:
    """Parse `data` into dataclass `cls`; every problem becomes a SpecError naming its path."""
    if not isinstance(data, dict):
        raise SpecError(path, f"must be an object, got {type_name(data)}")
    hints, by_key = shape_of(cls)
    for key in data:
        if key not in by_key:
            known = ", ".join(sorted(by_key))
            raise SpecError(join_path(path, str(key)), f"unknown field (known fields: {known})")
    kwargs: dict[str, Any] = {}
    for key, f in by_key.items():
        value = data.get(key)
        rule = field_rule(f)
        if value is None:  # the apiserver prunes nulls before defaulting; so do we
            if rule.is_required:
                raise SpecError(join_path(path, key), "required field is missing")
            continue
        kwargs[f.name] = convert(hints[f.name], value, rule, join_path(path, key))
    try:
        return cls(**kwargs)
    except SpecError as exc:
        raise exc.under(path) from None


def convert(hint: Any, value: Any, rule: Rule, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return convert(options[0], value, rule, path)
    if origin is list:
        if not isinstance(value, list):
            raise SpecError(path, f"must be an array, got {type_name(value)}")
        check_count(len(value), rule, path)
        (item,) = typing.get_args(hint)
        item_rule = rule.items or Rule()
        return [convert(item, v, item_rule, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(path, f"must be an object, got {type_name(value)}")
        check_count(len(value), rule, path)
        _, item = typing.get_args(hint)
        item_rule = rule.items or Rule()
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SpecError(path, f"keys must be strings, got {type_name(k)}")
            out[k] = convert(item, v, item_rule, join_path(path, k))
        return out
    if dataclasses.is_dataclass(hint):
        return build(typing.cast(type, hint), value, path)
    return convert_scalar(hint, value, rule, path)


def convert_scalar(hint: Any, value: Any, rule: Rule, path: str) -> Any:
    if rule.is_quantity:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise SpecError(
                path, f"must be a quantity (e.g. 4, 500m, 16Gi), got {type_name(value)}"
            )
        text = str(value)
        if not re.fullmatch(QUANTITY_PATTERN, text):
            raise SpecError(path, f"must be a quantity (e.g. 4, 500m, 16Gi), got {text!r}")
        return text
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"must be a boolean, got {type_name(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"must be an integer, got {type_name(value)}")
        check_range(value, rule, path)
        return value
    if hint is float:
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value):
            raise SpecError(path, f"must be a number, got {value!r}")
        check_range(value, rule, path)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {type_name(value)}")
        check_string(value, rule, path)
        return value
    raise TypeError(f"unsupported field type {hint!r} at {path}")  # a bug in the dataclasses


def check_range(value: float, rule: Rule, path: str) -> None:
    if rule.minimum is not None:
        if rule.exclusive_minimum and value <= rule.minimum:
            raise SpecError(path, f"must be > {rule.minimum:g}, got {value:g}")
        if value < rule.minimum:
            raise SpecError(path, f"must be >= {rule.minimum:g}, got {value:g}")
    if rule.maximum is not None and value > rule.maximum:
        raise SpecError(path, f"must be <= {rule.maximum:g}, got {value:g}")


def check_string(value: str, rule: Rule, path: str) -> None:
    if rule.enum is not None and value not in rule.enum:
        raise SpecError(path, f"must be one of {', '.join(rule.enum)}; got {value!r}")
    if rule.min_length is not None and len(value) < rule.min_length:
        need = "must not be empty" if rule.min_length == 1 else f"needs {rule.min_length}+ chars"
        raise SpecError(path, need)
    if rule.max_length is not None and len(value) > rule.max_length:
        raise SpecError(path, f"must be at most {rule.max_length} characters, got {len(value)}")
    if rule.pattern is not None and not re.search(rule.pattern, value):
        raise SpecError(path, f"must match {rule.pattern}, got {value!r}")


def check_count(count: int, rule: Rule, path: str) -> None:
    if rule.max_items is not None and count > rule.max_items:
        raise SpecError(path, f"must have at most {rule.max_items} entries, got {count}")


def to_dict(obj: Any) -> Any:
    """A dataclass tree as a manifest dict: camelCase keys, None (absent) fields left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                out[camel(f.name)] = to_dict(value)
        return out
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
