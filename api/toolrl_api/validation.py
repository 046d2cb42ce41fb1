"""A spec checked against the ToolRLJob CRD's own schema and CEL rules, as the apiserver checks it.

The CRD (crds/toolrl.dev_toolrljobs.yaml) is the one home of the bounds, enums and rules of a spec.
A job that came through the cluster has met them; a hand-written `job.json`
(`python -m trainer_entry run --spec job.json`) has not. This module applies the CRD's schema of
`spec` (crd_schema.py, generated from the CRD by `make chart-generate`) to such a spec:

- the structural schema (types, bounds, enums, patterns, required, sizes, `x-kubernetes-list-type:
  set`) with jsonschema (the CRD's schemas are OpenAPI v3 of draft-4 style: `exclusiveMinimum: true`);
- every `x-kubernetes-validations` rule with cel-python, in the apiserver's terms: `self` is the value
  at the rule's place in the schema, properties named like CEL keywords are escaped (`function` is
  `self.__function__`), unknown fields are invisible, and Kubernetes' `isURL` and `quantity` library
  functions are registered. Transition rules (`oldSelf`) are skipped: a file has no old object.

As in the apiserver, a type, required, enum or size error stops the CEL rules from running (they would
read what is not there); each error names the field and says, in the CRD's own words, what to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import celpy
import jsonschema
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from .crd_schema import SPEC_SCHEMA

ROOT = "spec"
VALIDATIONS = "x-kubernetes-validations"
TRANSITION = re.compile(r"\boldSelf\b")
# The structural errors after which the apiserver does not run the CEL rules (k8s' hasBlockingErr:
# NotSupported, Required, TooLong, TooMany, TypeInvalid).
BLOCKING = frozenset({"type", "anyOf", "required", "enum", "maxLength", "maxItems", "maxProperties"})
RULES_NOT_CHECKED = (
    "the CRD's CEL rules were not checked because of the errors above; correct them to complete validation"
)


# ---- the schema's places and rules -------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry and where in the schema it sits."""

    where: tuple[str, ...]
    """Steps from `spec` to the rule's place: a property name, `[]` (each array item) or `{}` (each
    map value)."""
    rule: str
    message: str
    field_path: str = ""
    message_expression: str = ""

    @property
    def transition(self) -> bool:
        """A rule comparing with the old object (`oldSelf`): only an update has one."""
        return bool(TRANSITION.search(self.rule))

    @property
    def place(self) -> str:
        return ROOT + "".join(s if s in ("[]", "{}") else f".{s}" for s in self.where)


def _steps(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(step, subschema) one level down: each property by name, `[]` (the items) and `{}` (a map's values)."""
    yield from schema.get("properties", {}).items()
    if isinstance(schema.get("items"), dict):
        yield "[]", schema["items"]
    if isinstance(schema.get("additionalProperties"), dict):
        yield "{}", schema["additionalProperties"]


def schema_places(
    schema: dict[str, Any], where: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(place, subschema) of the schema and of every schema under it, each place before those under it;
    a place is the steps from the schema's root (see `Rule.where`)."""
    yield where, schema
    for step, sub in _steps(schema):
        yield from schema_places(sub, (*where, step))


def _rules_with_schemas(
    schema: dict[str, Any], where: tuple[str, ...] = ()
) -> Iterator[tuple[Rule, dict[str, Any]]]:
    for place, sub in schema_places(schema, where):
        for entry in sub.get(VALIDATIONS, []):
            rule = Rule(
                where=place,
                rule=entry["rule"],
                message=entry.get("message", ""),
                field_path=entry.get("fieldPath", ""),
                message_expression=entry.get("messageExpression", ""),
            )
            yield rule, sub


def rules(schema: dict[str, Any] = SPEC_SCHEMA, where: tuple[str, ...] = ()) -> list[Rule]:
    """Every CEL rule of the schema, in the schema's order (a place's own rules before its children's)."""
    return [rule for rule, _ in _rules_with_schemas(schema, where)]


def _places(
    schema: dict[str, Any], value: Any, where: tuple[str, ...], path: str
) -> Iterator[tuple[str, Any]]:
    """(field path, value) of each value present at the schema place `where`."""
    if not where:
        yield path, value
        return
    step, rest = where[0], where[1:]
    sub = dict(_steps(schema))[step]
    if step == "[]":
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield from _places(sub, item, rest, f"{path}[{i}]")
    elif step == "{}":
        if isinstance(value, dict):
            for key, item in value.items():
                yield from _places(sub, item, rest, f"{path}[{key!r}]")
    elif isinstance(value, dict) and step in value:
        yield from _places(sub, value[step], rest, f"{path}.{step}")


# ---- the structural schema (jsonschema) -----------------------------------------------------------------


def _list_type(validator: Any, list_type: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """`x-kubernetes-list-type`: a `set` holds no value twice; a `map` no two items with the same keys."""
    if not isinstance(instance, list):
        return
    if list_type == "set":
        keys = instance
    elif list_type == "map":
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [tuple(item.get(n) for n in names) if isinstance(item, dict) else None for item in instance]
    else:
        return
    seen: list[Any] = []
    for key in keys:
        if key in seen:
            yield jsonschema.ValidationError(f"has {key!r} twice", validator="x-kubernetes-list-type")
            return
        seen.append(key)


StructuralValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # (its stubs)
    jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type}
)


def _field(path: Any, root: str = ROOT) -> str:
    return root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _bound(schema: dict[str, Any], low: bool) -> str:
    if low:
        return f"> {schema['minimum']}" if schema.get("exclusiveMinimum") else f">= {schema['minimum']}"
    return f"< {schema['maximum']}" if schema.get("exclusiveMaximum") else f"<= {schema['maximum']}"


def _structural_messages(error: jsonschema.ValidationError, root: str = ROOT) -> list[tuple[str, str]]:
    """(field, message) for one jsonschema error, in the trainer's wording: what is wrong, what to do."""
    field, kind = _field(error.absolute_path, root), error.validator
    # what the error carries is the CRD's schema and the spec's value: JSON data, typed Any here (the
    # stubs' unions admit jsonschema's unset marker, which a raised error never carries)
    schema: Any = error.schema
    want: Any = error.validator_value
    got: Any = error.instance
    if kind == "required":
        missing = [name for name in want if not (isinstance(got, dict) and name in got)]
        out = []
        for name in missing:
            about = schema.get("properties", {}).get(name, {}).get("description", "")
            out.append((f"{field}.{name}", "is required" + (f": {about}" if about else "")))
        return out
    if kind == "type":
        article = "an" if want in ("integer", "object", "array") else "a"
        return [(field, f"must be {article} {want}, got {got!r}")]
    if kind == "anyOf" and schema.get("x-kubernetes-int-or-string"):
        return [(field, f"must be an integer or a string, got {got!r}")]
    if kind == "enum":
        return [(field, f"unknown value {got!r}; use one of {', '.join(map(str, want))}")]
    if kind in ("minimum", "maximum"):
        return [(field, f"must be {_bound(schema, kind == 'minimum')}, got {got!r}")]
    if kind == "minItems":
        return [(field, f"needs at least {want} item{'s' * (want != 1)}, got {len(got)}")]
    if kind == "maxItems":
        return [(field, f"takes at most {want} items, got {len(got)}")]
    if kind == "minLength":
        return [(field, "must not be empty" if want == 1 else f"must be at least {want} characters long")]
    if kind == "maxLength":
        return [(field, f"must be at most {want} characters long, got {len(got)}")]
    if kind == "maxProperties":
        return [(field, f"takes at most {want} keys, got {len(got)}")]
    if kind == "pattern":
        return [(field, f"{got!r} does not match the pattern {want}")]
    return [(field, error.message)]


# ---- the CEL rules (cel-python) --------------------------------------------------------------------------

# CEL's reserved words, which Kubernetes escapes as property names (`__{word}__`); see the CRD docs'
# "Escaping" of x-kubernetes-validations.
CEL_RESERVED = frozenset(
    {
        *("true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function"),
        *("if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"),
    }
)


def escape(name: str) -> str:
    """A property name as a CEL expression sees it, per Kubernetes' escaping rules."""
    if name in CEL_RESERVED:
        return f"__{name}__"
    return (
        name.replace("__", "__underscores__").replace(".", "__dot__").replace("-", "__dash__")
        .replace("/", "__slash__")
    )


def to_cel(schema: dict[str, Any], value: Any) -> Any:
    """A JSON value as CEL sees it at a place with this schema: integers and numbers by the schema's
    type, the declared properties of an object (escaped) without its unknown fields, a map's keys as
    they are."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    kind = schema.get("type")
    if isinstance(value, int | float) and not schema.get("x-kubernetes-int-or-string"):
        if kind == "number" or isinstance(value, float):
            return celtypes.DoubleType(value)
        return celtypes.IntType(value)
    if isinstance(value, list):
        items = schema.get("items", {})
        return celtypes.ListType([to_cel(items, item) for item in value])
    if isinstance(value, dict):
        if "properties" in schema:
            props = schema["properties"]
            return celtypes.MapType(
                {celtypes.StringType(escape(k)): to_cel(props[k], v) for k, v in value.items() if k in props}
            )
        if isinstance(schema.get("additionalProperties"), dict):
            extra = schema["additionalProperties"]
            return celtypes.MapType({celtypes.StringType(k): to_cel(extra, v) for k, v in value.items()})
    return json_to_cel(value)


def is_url(value: Any) -> celtypes.BoolType:
    """Kubernetes' `isURL`: Go's url.ParseRequestURI accepts it (an absolute URL, or an absolute path)."""
    text = str(value)
    if not text or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return celtypes.BoolType(False)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(bool(parts.scheme) or text.startswith("/"))


_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SCALE = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in zip("numkMGTPE", (-9, -6, -3, 3, 6, 9, 12, 15, 18), strict=True)},
}


class Quantity:
    """A Kubernetes resource quantity (`quantity('500m')`), as its CEL library has it."""

    def __init__(self, text: str) -> None:
        match = _QUANTITY.match(text)
        if match is None:
            raise ValueError(f"quantities must match the regular expression {_QUANTITY.pattern}: {text!r}")
        number, suffix = match.groups()
        if not suffix:
            scale = Decimal(1)
        elif suffix in _SCALE:
            scale = _SCALE[suffix]
        else:  # a decimal exponent: 2e3
            scale = Decimal(10) ** int(suffix[1:])
        try:
            self.value = Decimal(number) * scale
        except InvalidOperation as exc:  # pragma: no cover - the pattern admits only numbers
            raise ValueError(f"not a quantity: {text!r}") from exc


def _quantity(text: Any) -> Quantity:
    return Quantity(str(text))


def _is_quantity(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_QUANTITY.match(str(text)) is not None)


def _as_approximate_float(q: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(q.value))


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value != q.value.to_integral_value() or not math.isfinite(q.value):
        raise ValueError(f"{q.value} is not an integer quantity")
    return celtypes.IntType(int(q.value))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "isURL": is_url,
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "asApproximateFloat": _as_approximate_float,
    "asInteger": _as_integer,
}
"""The Kubernetes CEL library functions our rules use (the rest of CEL is cel-python's own)."""


@dataclass(frozen=True)
class CompiledRule:
    rule: Rule
    schema: dict[str, Any]
    program: celpy.Runner
    message_program: celpy.Runner | None


def compile_rules(schema: dict[str, Any]) -> list[CompiledRule]:
    """Every rule of the schema but the transition ones, compiled; a rule cel-python cannot compile is
    an error here (tests/unit/api/test_validation.py compiles the CRD's)."""
    env = celpy.Environment()
    out = []
    for rule, at in _rules_with_schemas(schema):
        if rule.transition:
            continue
        program = env.program(env.compile(rule.rule), functions=FUNCTIONS)
        message = (
            env.program(env.compile(rule.message_expression), functions=FUNCTIONS)
            if rule.message_expression
            else None
        )
        out.append(CompiledRule(rule, at, program, message))
    return out


def _message(compiled: CompiledRule, activation: dict[str, Any]) -> str:
    if compiled.message_program is not None:
        try:
            text = compiled.message_program.evaluate(activation)
            if isinstance(text, str) and text.strip():
                return str(text)
        except CELEvalError:
            pass
    return compiled.rule.message or f"failed rule: {compiled.rule.rule}"


# ---- the validator -----------------------------------------------------------------------------------


class CrdValidator:
    """The CRD's schema of `spec` (or of a field of it, named `root` in the messages) and its rules,
    compiled once."""

    def __init__(self, schema: dict[str, Any] = SPEC_SCHEMA, root: str = ROOT) -> None:
        self.schema, self.root = schema, root
        self.structural = StructuralValidator(schema)
        self.rules = compile_rules(schema)

    def errors(self, spec: Any) -> list[str]:
        """`field: message` for each way the (defaulted) spec breaks the CRD; empty when it is valid."""
        out: list[str] = []
        blocking = False
        for error in self.structural.iter_errors(spec):
            blocking = blocking or error.validator in BLOCKING
            for field, message in _structural_messages(error, self.root):
                line = f"{field}: {message}"
                if line not in out:
                    out.append(line)
        if blocking:
            return [*out, RULES_NOT_CHECKED]
        for compiled in self.rules:
            for path, value in _places(self.schema, spec, compiled.rule.where, self.root):
                activation = {"self": to_cel(compiled.schema, value)}
                result: object
                try:
                    result = compiled.program.evaluate(activation)
                except CELEvalError as exc:
                    result = exc
                if isinstance(result, celtypes.BoolType) and bool(result):
                    continue
                message = _message(compiled, activation)
                if not isinstance(result, celtypes.BoolType):
                    message += f" (the rule `{compiled.rule.rule}` could not be evaluated: {result!s})"
                out.append(f"{path}{compiled.rule.field_path}: {message}")
        return out


@cache
def crd_validator() -> CrdValidator:
    """The validator of the CRD this package was generated from (compiled on first use)."""
    return CrdValidator()


@cache
def tools_validator() -> CrdValidator:
    """The validator of `spec.tools` alone (the tool pool's tools.yaml): its schema and rules, those of
    each entry and of the list (unique names), with messages that name `tools[i]`."""
    return CrdValidator(SPEC_SCHEMA["properties"]["tools"], root="tools")
