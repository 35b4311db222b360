"""How bad input is worded: pydantic's validation errors in GPUlayer's words.

Every error is one line ``INPUT: PROBLEM; accepted: WHAT`` where INPUT is written the way
its user wrote it. A :class:`Spelling` says how that is: ``CommandJob(timeout=inf)`` for a
record built by hand, ``--timeout inf`` for ``gpulayer submit``, ``Trainer(gpus_per_node=-1)``
for the PyTorch API, ``body.spec.retries=500`` for a request to the server. pydantic's own
messages are re-worded from their error type (never quoted); our validators' messages,
which already say what is wrong and what is accepted, are kept.
"""

from __future__ import annotations

import enum
import shlex
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpulayer.errors import InvalidInput, InvalidRequirement

__all__ = ["Spelling", "build", "invalid_input"]

#: what text GPUlayer accepts everywhere (see gpulayer.specs.text_problem)
TEXT = "UTF-8 text without NUL bytes"


_MISSING: Any = object()
Loc = tuple["str | int", ...]


def _shell(value: Any) -> str:
    """``value`` as it would be typed in a shell (repr where it holds unprintable characters)."""
    if isinstance(value, str):
        return shlex.quote(value) if value.isprintable() else repr(value)
    return _number(value)


@dataclass(frozen=True)
class Spelling:
    """How one front end writes its inputs, so that an error names an input its user's way.

    With ``call`` (Python keywords) an input reads ``CALL(name=value)``: ``@gl.remote(gpus=-1)``.
    Without (command-line flags) it reads ``--name value``; spec fields filled from the words
    after ``--`` are listed in ``words`` with the number of the first word they take.
    ``names`` maps a spec path (``requirements.gpus``, ``timeout``) or an option that is no
    spec field (``allow_unknown_accelerator``) to the user's name (``--gpus``,
    ``gpus_per_node``); a path not listed is written as itself.
    """

    call: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    words: Mapping[str, int] = field(default_factory=dict)
    #: fields of a request to the server: ``body.spec.retries=500``
    where: str | None = None

    def name(self, path: str) -> str:
        return self.names.get(path, path)

    def input(self, path: str, value: Any = _MISSING, rest: Loc = ()) -> str:
        """The input at ``path`` (``rest``: an index or a key inside it) with ``value``, as written."""
        if self.call is not None:
            return f"{self.call}({self._keyword(path, value, rest)})"
        if self.where is not None:
            return self._field(path, value, rest)
        if path in self.words:
            return self._word(path, value, rest)
        return self._flag(path, value, rest)

    def option(self, path: str, value_text: str) -> str:
        """How to write the option at ``path`` with a value, for hints: ``--accelerator KIND``."""
        if self.call is not None:
            return f"{self.name(path)}={value_text}"
        return f"{self.name(path)} {value_text}"

    def switch(self, option: str) -> str:
        """How to turn on the boolean option ``option``: ``--allow-unknown-accelerator``."""
        return self.name(option) if self.call is None else f"{self.name(option)}=True"

    def _keyword(self, path: str, value: Any, rest: Loc) -> str:
        name = self.name(path)
        if not rest:
            return name if value is _MISSING else f"{name}={value!r}"
        shown = "..." if value is _MISSING else repr(value)
        if isinstance(rest[0], int):
            return f"{name}[{rest[0]}]={shown}"
        return f"{name}={{{rest[0]!r}: {shown}}}"

    def _field(self, path: str, value: Any, rest: Loc) -> str:
        name = ".".join(str(p) for p in (self.where, path, *rest) if p != "")
        if value is _MISSING or isinstance(value, (Mapping, list, tuple)):
            return name
        text = repr(value)
        return f"{name}={text[:80] + '...' if len(text) > 80 else text}"

    def _flag(self, path: str, value: Any, rest: Loc) -> str:
        name = self.name(path)
        if value is _MISSING and not rest:
            return name
        if rest and not isinstance(rest[0], int):
            shown = "..." if value is _MISSING else str(value)
            return f"{name} {_shell(f'{rest[0]}={shown}')}"
        if not rest and isinstance(value, Mapping):
            return " ".join(f"{name} {_shell(f'{k}={v}')}" for k, v in value.items()) or name
        if not rest and isinstance(value, (list, tuple)):
            return " ".join(f"{name} {_shell(v)}" for v in value) or name
        return name if value is _MISSING else f"{name} {_shell(value)}"

    def _word(self, path: str, value: Any, rest: Loc) -> str:
        number = self.words[path] + (rest[0] if rest and isinstance(rest[0], int) else 0)
        if isinstance(value, str):
            return f"argument {number} after -- {_shell(value)}"
        return "the command after --"


#: ``"Record.field"`` -> what is accepted there, in words; each module of records adds its own
ACCEPTED: dict[str, str] = {}


def _accepted(owner: type[BaseModel], name: str) -> str:
    for cls in owner.__mro__:
        text = ACCEPTED.get(f"{cls.__name__}.{name}")
        if text is not None:
            return text
    return _from_field(owner, name)


def _from_field(owner: type[BaseModel], name: str) -> str:
    """What a field accepts, read off its type and bounds (records without a table entry)."""
    info = owner.model_fields.get(name)
    if info is None:
        return "a value of the documented type"
    bounds = {k: getattr(m, k) for m in info.metadata
              for k in ("ge", "gt", "le", "lt", "min_length", "max_length") if getattr(m, k, None) is not None}
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # (X | None: what X takes)
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    if typing.get_origin(annotation) in (list, tuple, set, frozenset):
        of = typing.get_args(annotation)
        items = _items(of[0]) if of else "values"
        low, high = bounds.get("min_length"), bounds.get("max_length")
        if high is not None:
            return f"a list of {low or 0} to {high} {items}" if low else f"a list of at most {high} {items}"
        return f"a non-empty list of {items}" if low == 1 else f"a list of {items}"
    if typing.get_origin(annotation) is dict:
        key, value = (typing.get_args(annotation) or (Any, Any))[:2]
        return f"a mapping of {_items(key).removesuffix(' values')} keys to {_items(value)}"
    base = annotation
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in base)
    if typing.get_origin(base) is typing.Literal:
        return "one of " + ", ".join(str(v) for v in typing.get_args(base))
    if base in (int, float):
        what = "a whole number" if base is int else "a number"
        low = f"from {_number(bounds['ge'])}" if "ge" in bounds else (f"above {_number(bounds['gt'])}" if "gt" in bounds else "")
        high = f"to {_number(bounds['le'])}" if "le" in bounds else (f"below {_number(bounds['lt'])}" if "lt" in bounds else "")
        return " ".join(p for p in (what, low, high) if p)
    if base is str:
        return "text"
    if base is bool:
        return "true or false"
    return "a value of the documented type"


#: what a list of these holds, in words (a list field without a table entry)
_ITEMS: dict[Any, str] = {str: "text values", int: "whole numbers", float: "numbers", bool: "true or false values"}


def _items(tp: Any) -> str:
    """What a list (or a mapping's values) of ``tp`` holds, in words."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is typing.Literal:
        return "values among " + ", ".join(str(v) for v in typing.get_args(tp))
    kinds = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    if all(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds):
        return "records"
    return _ITEMS.get(tp, "values")


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _problem(err: Mapping[str, Any]) -> str:
    """What is wrong, in our words, for one of pydantic's error types."""
    kind: str = err["type"]
    ctx = err.get("ctx") or {}
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds:
        words, key = bounds[kind]
        return f"must be {words} {_number(ctx.get(key))}"
    if kind.startswith("int_"):
        return "not a whole number"
    if kind.startswith("float_"):
        return "not a number"
    if kind.startswith("bool_"):
        return "not true or false"
    simple = {
        "missing": "missing",
        "finite_number": "not a finite number",
        "string_type": "not text",
        "list_type": "not a list", "tuple_type": "not a list", "iterable_type": "not a list",
        "dict_type": "not a mapping", "mapping_type": "not a mapping",
        "model_type": "not a record or a mapping", "model_attributes_type": "not a record or a mapping",
        "literal_error": "not one of the choices", "enum": "not one of the choices",
        "too_short": "must not be empty", "string_too_short": "must not be empty",
        "string_pattern_mismatch": "not in the accepted form",
    }
    if kind in ("string_too_long", "too_long"):
        return f"too long (at most {ctx.get('max_length')})"
    return simple.get(kind, "not accepted")


def _records(tp: Any) -> dict[str, type[BaseModel]]:
    """The records a field of type ``tp`` holds, by the tag pydantic puts in an error's
    location for each (a union of records tagged by a ``Literal`` field: ``{"command":
    CommandJob, ...}``; one record: ``{"": it}``); empty when it holds no records."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    kinds = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    kinds = tuple(k for k in kinds if k is not type(None))
    if not kinds or not all(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds):
        return {}
    if len(kinds) == 1:
        return {"": kinds[0]}
    tags: dict[str, type[BaseModel]] = {}
    for k in kinds:
        for info in k.model_fields.values():
            if typing.get_origin(info.annotation) is typing.Literal and isinstance(info.default, str):
                tags[info.default] = k
                break
    return tags


def _field_type(owner: type[BaseModel], name: str) -> Any:
    """The type of ``owner``'s field ``name``, a list's or a mapping's items for one of those."""
    info = owner.model_fields.get(name)
    tp = info.annotation if info is not None else None
    if typing.get_origin(tp) in (list, tuple):
        return typing.get_args(tp)[0]
    if typing.get_origin(tp) is dict:
        return typing.get_args(tp)[1]
    return tp


def fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """The fields of the record that a key at ``loc + (key,)`` would be one of (``hosts.0``
    of a pool: a host's), sorted; empty where ``loc`` leads to no record."""
    _, _, _, rest, record = _resolve(model, (*loc, "\0"))
    return sorted(record.model_fields) if record is not None and rest == ("\0",) else []


def _resolve(model: type[BaseModel], loc: Loc) -> tuple[type[BaseModel], str, str, Loc, type[BaseModel] | None]:
    """Split ``loc`` into the field it names and what lies inside that field's value.

    Returns (the record owning the field, the field's name, its path from ``model`` as the
    user writes it, the rest of ``loc``, the record type the rest applies to, if it is one).
    The walk goes into records nested in records, and in lists and mappings of records (a
    batch's ``specs.0.retries``), where pydantic's location names the tag of a union member
    (``specs.0.command.retries``): the tag is not part of the path as written.
    """
    owner, name = model, ""
    parts: list[str] = []
    holds: dict[str, type[BaseModel]] = {"": model}
    at: type[BaseModel] | None = model
    i = 0
    while i < len(loc):
        part = loc[i]
        if at is None and isinstance(part, str) and part in holds:  # a union member's tag
            at = holds[part]
            i += 1
            continue
        if at is not None and isinstance(part, str) and part in at.model_fields:
            owner, name = at, part
            parts.append(part)
            annotation = at.model_fields[part].annotation
            holds, at = _records(annotation), None
            if "" in holds:
                at = holds[""]
            elif not holds:  # a list or a mapping of records: one step in
                origin, args = typing.get_origin(annotation), typing.get_args(annotation)
                if origin in (list, tuple) and args and i + 1 < len(loc) and isinstance(loc[i + 1], int):
                    holds = _records(args[0])
                elif origin is dict and len(args) == 2 and i + 1 < len(loc) and isinstance(loc[i + 1], str):
                    holds = _records(args[1])
                if holds:
                    parts.append(str(loc[i + 1]))
                    i += 1
                    at = holds.get("")
            i += 1
            continue
        break
    return owner, name, ".".join(parts), tuple(loc[i:]), at


def _lookup(data: Any, loc: Loc) -> Any:
    for part in loc:
        try:
            if isinstance(data, Mapping):
                data = data[part]
            elif isinstance(data, (list, tuple)) and isinstance(part, int):
                data = data[part]
            else:
                data = getattr(data, str(part))
        except (KeyError, IndexError, TypeError, AttributeError):
            return _MISSING
    return data


def invalid_input(exc: ValidationError, model: type[BaseModel], spelling: Spelling, data: Any) -> InvalidInput:
    """Word pydantic's ``exc`` (from validating ``data`` as ``model``) the way ``spelling`` says.

    Each error becomes one line ``INPUT: PROBLEM; accepted: WHAT``. Our own validators'
    messages carry their problem and what is accepted; pydantic's are re-worded from their
    error type, never quoted.
    """
    lines: list[str] = []
    kind: type[InvalidInput] | None = None
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        owner, name, path, rest, record = _resolve(model, loc)
        original = (err.get("ctx") or {}).get("error")
        if isinstance(original, InvalidInput) and kind is None:
            kind = type(original)
        if err["type"] == "extra_forbidden" and record is not None and rest:
            extra = f"{path}.{rest[0]}" if path else str(rest[0])
            where = spelling.input(extra, err.get("input", _MISSING))
            lines.append(f"{where}: no such field; accepted: {', '.join(record.model_fields)}")
            continue
        if not path and original is not None:
            # a check over the whole record (the JSON check of a function's arguments) words its input itself
            lines.append(str(original))
            continue
        value = _MISSING if err["type"] == "missing" else err.get("input", _MISSING)
        if err["type"] == "string_unicode" and isinstance(value, str):
            # pydantic's own check of constrained text, before ours could run
            from gpulayer.specs import text_problem  # specs words its own errors with this module

            original = InvalidInput(f"{text_problem(value) or 'is not valid UTF-8'}; accepted: {TEXT}")
        if rest and rest[-1] == "[key]":
            rest = rest[:-1]
            value = _lookup(data, loc[:-1])
        where = spelling.input(path, value, rest) if path else (spelling.call or spelling.where or model.__name__)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # (which kind of record)
            ctx = err.get("ctx") or {}
            key = str(ctx.get("discriminator", "kind")).strip("'")
            known = ctx.get("expected_tags") or ", ".join(repr(t) for t in _records(_field_type(owner, name)))
            said = f"{key} {ctx['tag']!r} is not one of the choices" if "tag" in ctx else f"no {key}"
            lines.append(f"{spelling.input(path, _MISSING, rest) if path else where}: {said}; accepted: a "
                         f"record whose {key} is one of {known}")
            continue
        if original is not None:
            lines.append(f"{where}: {original}")
        else:
            lines.append(f"{where}: {_problem(err)}; accepted: {_accepted(owner, name) if name else 'a mapping of fields'}")
        if kind is None and (model.__name__ == "Requirements" or path.startswith("requirements")):
            kind = InvalidRequirement
    return (kind or InvalidInput)("\n".join(lines))


M = TypeVar("M", bound=BaseModel)


def build(model: type[M], data: Mapping[str, Any], spelling: Spelling, *, context: Any = None) -> M:
    """``model`` validated from ``data`` (with pydantic's validation ``context``); bad input
    raises :class:`InvalidInput` worded by ``spelling``."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise invalid_input(exc, model, spelling, data) from None
