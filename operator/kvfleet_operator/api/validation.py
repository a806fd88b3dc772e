"""The InferencePool's field rules, declared once with pydantic, and its errors as SpecError.

Each spec type is a `@spec_type` class: a pydantic dataclass whose fields carry their
defaults and rules (`Field(ge=..., le=..., pattern=..., max_length=...)`, `OneOf(...)`,
`Quantity`), whose keys are the CRD's camelCase names, and whose cross-field rules (the
CRD's CEL rules) are `model_validator(mode="after")` methods that raise SpecError with a
path relative to the object. `json_schema(PoolSpec)` is what the tests compare with the
CRD's openAPIV3Schema, so the parser and the apiserver agree on defaults and ranges.

Every problem becomes one SpecError naming the CRD field path and what the field accepts:
`spec.topology.prefill.replicas.min: must be an integer in [0, 1000], got -1`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from types import NoneType
from typing import Annotated, Any, TypeVar, dataclass_transform

from kvfleet_router.config import bounds_text, field_type, shown
from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError, core_schema

from .errors import SpecError, join_path

# Kubernetes resource.Quantity, e.g. 500m, 4Gi, 1.5, 2e3.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# JSON's scalars, strictly as the apiserver reads them: no "16" for 16, no true for 1.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # an integer is accepted and becomes a float
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


def camel(name: str) -> str:
    """A field's manifest key: max_num_seqs -> maxNumSeqs."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _QuantityRule:
    """A Kubernetes quantity: an integer or a string like 500m or 16Gi, kept as a string."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: Any) -> str:
            text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) \
                else None  # fmt: skip
            if text is None or not re.fullmatch(QUANTITY_PATTERN, text):
                raise PydanticCustomError("quantity", "must be a quantity (e.g. 4, 500m, 16Gi)")
            return text

        return core_schema.no_info_plain_validator_function(check)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": QUANTITY_PATTERN, "x-kubernetes-int-or-string": True}


Quantity = Annotated[str, _QuantityRule()]

# Manifests use the camelCase keys only (`validate` turns names off); code may use either.
# Patterns match as the CRD tests' JSON-schema validator does (Python's re.search).
_CONFIG = ConfigDict(extra="forbid", alias_generator=camel, validate_by_name=True,
                     validate_by_alias=True, allow_inf_nan=False, regex_engine="python-re")

_T = TypeVar("_T")


@dataclass_transform(field_specifiers=(Field,))
def spec_type(cls: type[_T]) -> type[_T]:
    """An InferencePool spec type. From a manifest, a null field counts as absent (the
    apiserver prunes nulls before defaulting); built in code, a problem raises SpecError
    with the path relative to the class."""

    def drop_nulls(cls: type[Any], data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k not in known}

    annotated: Any = cls
    annotated._drop_nulls = model_validator(mode="before")(drop_nulls)
    out: Any = pydantic_dataclass(cls, config=_CONFIG, slots=True)
    known = {camel(f.name) for f in dataclasses.fields(out)}  # manifest keys
    init = out.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise spec_error(exc, out, "") from None

    out.__init__ = __init__
    return out  # type: ignore[no-any-return]


def validate(cls: type[_T], data: Any, path: str) -> _T:
    """Parse manifest `data` (camelCase keys) into `cls`; problems raise SpecError."""
    try:
        value: _T = _adapter(cls).validate_python(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise spec_error(exc, cls, path) from None
    return value


def to_dict(obj: Any) -> Any:
    """A spec (or status) object as a manifest dict: camelCase keys, None (absent) left out."""
    return _adapter(type(obj)).dump_python(obj, by_alias=True, exclude_none=True)


def json_schema(cls: type[Any]) -> dict[str, Any]:
    """The JSON Schema of a spec type's manifest form, from the same field declarations."""
    return _adapter(cls).json_schema(by_alias=True)


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """One TypeAdapter per type, built once (building one costs milliseconds)."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


# --- pydantic's errors as SpecError: the CRD field path, then what the field accepts ---


def spec_error(exc: ValidationError, root: type[Any], path: str) -> SpecError:
    """The first problem pydantic found, under `path` (the object's own path)."""
    error = exc.errors()[0]
    loc = error["loc"]
    if loc[-1:] == ("[key]",):  # a map key, not a value
        return SpecError(join_path(path, _path(loc[:-2])),
                         f"keys must be strings, got {type_name(loc[-2])}")
    where = join_path(path, _path(loc))
    inner = (error.get("ctx") or {}).get("error")
    if isinstance(inner, SpecError):  # a cross-field rule; its path is below the object
        return type(inner)(join_path(where, inner.path), inner.message)
    return SpecError(where, _message(error, root))


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _message(error: Any, root: type[Any]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    loc = error["loc"]
    if kind == "missing":
        return "required field is missing"
    if kind == "unexpected_keyword_argument":
        owner, _ = field_type(root, loc[:-1], camel)
        known = sorted(camel(f.name) for f in dataclasses.fields(owner)) \
            if dataclasses.is_dataclass(owner) else []  # fmt: skip
        return f"unknown field (known fields: {', '.join(known)})"
    if kind == "enum":
        return f"must be one of {ctx['allowed']}; got {value!r}"
    if kind == "quantity":
        got = repr(value) if isinstance(value, str) else type_name(value)
        return f"must be a quantity (e.g. 4, 500m, 16Gi), got {got}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters, got {len(value)}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']}, got {value!r}"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} entries, got {len(value)}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    annotation, meta = field_type(root, loc, camel)
    if annotation in (int, float):
        what = "an integer" if annotation is int else "a finite number"
        return f"must be {what}{bounds_text(meta)}, got {shown(value, type_name)}"
    expected = {"bool_type": "a boolean", "string_type": "a string", "list_type": "an array",
                "dict_type": "an object", "dataclass_type": "an object"}
    if kind in expected:
        return f"must be {expected[kind]}, got {type_name(value)}"
    return str(error["msg"])  # pydantic's own words, for a rule this module has not met


def type_name(value: Any) -> str:
    """A value's JSON type, for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
             float: "number", NoneType: "null"}
    return names.get(type(value), type(value).__name__)
