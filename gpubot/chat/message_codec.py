"""A ``Message`` as JSON, and back: how a direct message rendered by one front end's process
reaches the process of the front end that reaches its person (``chat.dm_route``).

Only the neutral model is written: its dataclasses by name, its enums by value, its tuples as
lists. A ``Place`` is refused: it names a message of the front end that made it, which another
front end cannot link to.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from gpubot.chat.message import (
    Action,
    Actions,
    Break,
    Clipped,
    Code,
    Confirm,
    Context,
    Date,
    DateStyle,
    Emph,
    Heading,
    Kind,
    Mention,
    Message,
    Pre,
    Section,
    Sentence,
    Strong,
    Struck,
    Style,
    Table,
)

_SPANS = (Mention, Date, Code, Sentence, Strong, Emph, Struck, Clipped, Break)
_PARTS = (Confirm, Action, Heading, Section, Pre, Table, Context, Actions, Message)
_CLASSES: dict[str, type[Any]] = {c.__name__: c for c in (*_SPANS, *_PARTS)}
_ENUMS: dict[str, type[Enum]] = {c.__name__: c for c in (DateStyle, Style, Kind)}


def encode(msg: Message) -> str:
    """Return ``msg`` as JSON (``ValueError``: it holds what no other process can show)."""
    return json.dumps(_out(msg), ensure_ascii=False, separators=(",", ":"))


def decode(text: str) -> Message:
    """Return the message ``encode`` wrote (``ValueError``: it is not one)."""
    try:
        msg = _in(json.loads(text))
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not a message: {exc!r}") from None
    if not isinstance(msg, Message):
        raise ValueError(f"not a message: a {type(msg).__name__}")
    return msg


def _out(v: Any) -> Any:
    if isinstance(v, Enum):  # before str: these enums are strings too
        return {"~": type(v).__name__, "v": v.value}
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, tuple):
        return [_out(x) for x in v]
    name = type(v).__name__
    if is_dataclass(v) and _CLASSES.get(name) is type(v):
        return {"@": name, **{f.name: _out(getattr(v, f.name)) for f in fields(v)}}
    raise ValueError(f"a {name} cannot be shown by another front end")


def _in(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_in(x) for x in v)
    if not isinstance(v, dict):
        return v
    if "~" in v:
        return _ENUMS[v["~"]](v["v"])
    cls = _CLASSES[v["@"]]
    return cls(**{k: _in(x) for k, x in v.items() if k != "@"})
