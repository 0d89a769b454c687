"""The spec reference (docs/spec-reference.md), generated from the spec's models, so it cannot
drift from what ``pdscale validate`` accepts."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pdscale.spec import Spec, format_duration, parse_duration

__all__ = ["spec_reference"]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        base = _type_name(args[0])
        return "duration" if base == "int" and any("parse_duration" in repr(a) for a in args[1:]) \
            else base
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (tuple, list):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
        if hasattr(annotation, "__members__"):  # an enum
            return " \\| ".join(json.dumps(m.value) for m in annotation.__members__.values())
        return annotation.__name__
    return str(annotation)


def _default(field: FieldInfo, type_name: str) -> str:
    if field.is_required():
        return "**required**"
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "**required**"
    if isinstance(value, BaseModel):
        return "see the section"
    if type_name == "duration" and isinstance(value, int):
        return f"`{format_duration(value)}`"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} rules (see the examples)"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 60 else "(long; see the examples)"


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop(0)
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                t = stack.pop()
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    return seen


def spec_reference() -> str:
    lines = ["# Spec reference", "",
             "Generated from pdscale's spec models (`pdscale spec-reference`); every field of a "
             "spec file, its type, default and meaning. Durations take Prometheus syntax "
             "(`30s`, `5m`, `1h30m`) or seconds. Unknown fields are refused. Start from "
             "`examples/` and check a file with `pdscale validate`.", ""]
    for model in _models(Spec):
        lines += [f"## {model.__name__}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("Usage docs", "!!!")):
            lines += [" ".join(doc.split()), ""]
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            type_name = _type_name(field.annotation)
            if type_name == "int" and any(
                    getattr(m, "func", None) is parse_duration for m in field.metadata):
                type_name = "duration"  # pydantic keeps Annotated's validators apart
            meaning = " ".join((field.description or "").split())
            lines.append(f"| `{key}` | {type_name} | {_default(field, type_name)} | "
                         f"{meaning} |")
        lines.append("")
    return "\n".join(lines)
