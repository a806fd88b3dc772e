"""Validate InferencePool manifests offline, the way the apiserver would.

`kubectl apply --dry-run=client` cannot check a custom resource without a server, so this
stands in for it: apiserver-style defaulting, the CRD's structural schema (JSON Schema, with
unknown fields rejected as kubectl's strict field validation does) and every
`x-kubernetes-validations` CEL rule, evaluated with cel-python at its node.

    python -m kvfleet_operator.tools.crd_validate examples/*.yaml

Needs the `dev` extra (jsonschema, cel-python) and the CRD file from a source checkout.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / "inferencepools.kvfleet.io.yaml"


@dataclass(frozen=True, slots=True)
class Violation:
    layer: str  # "schema" or "cel"
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} [{self.layer}]"


def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return crd


def pool_schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


# -- defaulting (apiserver order: prune nulls, then fill defaults top-down) -------------------


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    value = copy.deepcopy(value)
    _default_in_place(schema, value)
    return value


def _default_in_place(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in [k for k, v in value.items() if v is None and k in props]:
            if not props[key].get("nullable"):
                del value[key]
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default_in_place(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                _default_in_place(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default_in_place(schema["items"], item)


# -- structural schema ----------------------------------------------------------------------


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields rejected (kubectl's default --validate=strict)."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in out:
        out["properties"] = {k: strict_schema(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out:
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_schema(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = strict_schema(out["items"])
    if "anyOf" in out:
        out["anyOf"] = [strict_schema(s) for s in out["anyOf"]]
    return out


_VALIDATORS: dict[int, Any] = {}


def _validator(schema: dict[str, Any]) -> Any:
    import jsonschema

    if id(schema) not in _VALIDATORS:
        root = strict_schema(schema)
        # The root metadata is validated by the apiserver itself, not by the CRD schema.
        root["properties"]["metadata"] = {"type": "object"}
        # OpenAPI v3.0 keeps draft 4's boolean exclusiveMinimum.
        _VALIDATORS[id(schema)] = (schema, jsonschema.Draft4Validator(root))
    return _VALIDATORS[id(schema)][1]


def schema_violations(schema: dict[str, Any], manifest: Any) -> list[Violation]:
    validator = _validator(schema)
    out = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        path = _dotted(list(error.absolute_path))
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            path = _dotted([*error.absolute_path, extra[0]]) if extra else path
        out.append(Violation("schema", path, error.message))
    return out


def _dotted(parts: list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# -- CEL ------------------------------------------------------------------------------------


def compile_rules(schema: dict[str, Any]) -> int:
    """Compile every CEL rule up front (a typo fails here, not on the first bad pool)."""
    count = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        for rule in node.get("x-kubernetes-validations") or []:
            _program(rule["rule"])
            count += 1
        stack += list((node.get("properties") or {}).values())
        inner = (node.get("additionalProperties"), node.get("items"))
        stack += [n for n in inner if isinstance(n, dict)]
    return count


def cel_violations(schema: dict[str, Any], manifest: Any) -> list[Violation]:
    out: list[Violation] = []
    _walk_cel(schema, manifest, "", out)
    return out


def _walk_cel(schema: dict[str, Any], value: Any, path: str, out: list[Violation]) -> None:
    for rule in schema.get("x-kubernetes-validations") or []:
        ok, detail = _eval_rule(rule["rule"], to_cel(schema, value))
        if not ok:
            where = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
            out.append(Violation("cel", where, rule.get("message") or f"failed {rule['rule']}"
                                 + (f" ({detail})" if detail else "")))
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                _walk_cel(sub, value[key], f"{path}.{key}" if path else key, out)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                _walk_cel(extra, item, f"{path}.{key}", out)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk_cel(schema["items"], item, f"{path}[{i}]", out)


_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    import celpy

    if rule not in _PROGRAMS:
        env = celpy.Environment()
        _PROGRAMS[rule] = env.program(env.compile(rule))
    return _PROGRAMS[rule]


def _eval_rule(rule: str, self_value: Any) -> tuple[bool, str]:
    import celpy

    try:
        result = _program(rule).evaluate({"self": self_value})
    except celpy.CELEvalError as exc:  # the apiserver treats an evaluation error as invalid
        return False, f"evaluation error: {exc.args[0] if exc.args else exc}"
    return bool(result), ""


def to_cel(schema: dict[str, Any], value: Any) -> Any:
    """JSON -> CEL values typed by the schema (a `number` field holding 2 is the double 2.0)."""
    from celpy import celtypes as t

    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and not isinstance(extra, dict):
            import celpy

            return celpy.json_to_cel(value)
        items = {}
        for key, item in value.items():
            fallback: dict[str, Any] = extra if isinstance(extra, dict) else {}
            sub = (props or {}).get(key, fallback)
            items[t.StringType(key)] = to_cel(sub, item)
        return t.MapType(items)
    if isinstance(value, list):
        item_schema = schema.get("items")
        each: dict[str, Any] = item_schema if isinstance(item_schema, dict) else {}
        return t.ListType([to_cel(each, item) for item in value])
    if isinstance(value, bool):
        return t.BoolType(value)
    if schema.get("type") == "number" and isinstance(value, int | float):
        return t.DoubleType(value)
    if isinstance(value, int):
        return t.IntType(value)
    if isinstance(value, float):
        return t.DoubleType(value)
    if isinstance(value, str):
        return t.StringType(value)
    import celpy

    return celpy.json_to_cel(value)


# -- the whole check ------------------------------------------------------------------------


def validate_manifest(manifest: Any, crd: dict[str, Any] | None = None) -> list[Violation]:
    """Default, then check schema; CEL runs only on a schema-valid object, like the apiserver."""
    schema = pool_schema(crd or load_crd())
    if not isinstance(manifest, dict):
        return [Violation("schema", "", "an InferencePool must be an object")]
    defaulted = apply_defaults(schema, manifest)
    found = schema_violations(schema, defaulted)
    return found or cel_violations(schema, defaulted)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths or paths[0] in ("-h", "--help"):
        print("usage: python -m kvfleet_operator.tools.crd_validate POOL.yaml [...]")
        return 0 if paths else 2
    crd = load_crd()
    status = 0
    for name in paths:
        try:
            docs = [d for d in yaml.safe_load_all(Path(name).read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            print(f"{name}: cannot read: {str(exc).splitlines()[0]}", file=sys.stderr)
            status = 1
            continue
        for doc in docs:
            problems = validate_manifest(doc, crd)
            for problem in problems:
                print(f"{name}: {problem}", file=sys.stderr)
            status = status or (1 if problems else 0)
            if not problems:
                print(f"{name}: valid")
    return status


if __name__ == "__main__":
    sys.exit(main())
