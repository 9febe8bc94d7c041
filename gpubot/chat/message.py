"""The neutral message model every front end renders: no chat system's markup or ids in it.

Text is a tuple of spans; each renderer escapes plain strings for its own surface. A plain
string never starts a line of its own (a newline in it is text, so a name can not forge a
line): only ``NL`` breaks one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Mention:
    """A person of the chat system, by the front end's own id (and a display name if known)."""

    id: str
    name: str | None = None


class DateStyle(StrEnum):
    """How much of a date a message shows."""

    FULL = "full"  # date and time to the second
    TIME = "time"  # hours and minutes


@dataclass(frozen=True)
class Date:
    """A moment (unix seconds), shown in the reader's own time zone where a front end can."""

    at: float
    style: DateStyle = DateStyle.FULL


@dataclass(frozen=True)
class Code:
    """A literal (a name, a command to type) shown as code."""

    text: str


@dataclass(frozen=True)
class Sentence:
    """A core sentence: its literals are marked with ``core.text.code`` and shown as code."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Spans shown bold."""

    parts: Text


@dataclass(frozen=True)
class Emph:
    """Spans shown in italics."""

    parts: Text


@dataclass(frozen=True)
class Struck:
    """Spans shown struck through (something that no longer holds)."""

    parts: Text


@dataclass(frozen=True)
class Clipped:
    """Spans shortened to at most ``most`` characters as rendered, the cut marked."""

    parts: Text
    most: int


@dataclass(frozen=True)
class Place:
    """Where another message is (a front end's ``MessageRef``), as a link its readers follow."""

    handle: Any


@dataclass(frozen=True)
class Break:
    """A line break."""


NL = Break()

Span = str | Mention | Date | Code | Sentence | Strong | Emph | Struck | Clipped | Place | Break
Text = tuple[Span, ...]


def bold(*parts: Span) -> Strong:
    return Strong(parts)


def italic(*parts: Span) -> Emph:
    return Emph(parts)


def clipped(most: int, *parts: Span) -> Clipped:
    return Clipped(parts, most)


def joined(spans: Iterable[Span], sep: str = ", ") -> list[Span]:
    """Return ``spans`` with ``sep`` between each two (names listed in a sentence)."""
    out: list[Span] = []
    for s in spans:
        out += [sep, s] if out else [s]
    return out


def lines(*rows: Text) -> Text:
    out: list[Span] = []
    for i, row in enumerate(rows):
        if i:
            out.append(NL)
        out.extend(row)
    return tuple(out)


class Style(StrEnum):
    """How an action is shown: the main choice, or one that destroys something."""

    PRIMARY = "primary"
    DANGER = "danger"


@dataclass(frozen=True)
class Confirm:
    """A question asked before an action runs (plain text throughout; destructive unless said)."""

    title: str
    text: str
    confirm: str
    deny: str = "Cancel"
    style: Style | None = Style.DANGER


@dataclass(frozen=True)
class Action:
    """A button: ``id`` names what it does, ``value`` what it does it to."""

    id: str
    label: str
    value: str
    style: Style | None = None
    confirm: Confirm | None = None


@dataclass(frozen=True)
class Heading:
    """A heading inside a message's body (one line of plain text)."""

    text: str


@dataclass(frozen=True)
class Section:
    """A paragraph of text; ``accessory``: one action beside it."""

    text: Text
    accessory: Action | None = None


@dataclass(frozen=True)
class Pre:
    """Preformatted lines (plain text, shown as they are, aligned)."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table: the first row is the header. ``lines``: the same table as terminal text
    (``core.text_table``), which text front ends show instead of laying out ``rows``."""

    rows: tuple[tuple[str, ...], ...]
    wrap: tuple[int, ...] = ()
    right: tuple[int, ...] = ()
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Context:
    """A line of small print: its parts shown side by side."""

    parts: tuple[Text, ...]


@dataclass(frozen=True)
class Actions:
    """A row of actions; ``group`` names the row (e.g. the request it decides)."""

    actions: tuple[Action, ...]
    group: str | None = None


def ctx(*parts: Text | str) -> Context:
    """Return a context line of ``parts`` (a string is one plain span)."""
    return Context(tuple((p,) if isinstance(p, str) else p for p in parts))


Part = Heading | Section | Pre | Table | Context | Actions


class Kind(StrEnum):
    """What a message is shown as: a message, or a person's own page (Slack's Home tab)."""

    MESSAGE = "message"
    PAGE = "page"


@dataclass(frozen=True)
class Message:
    """A message every front end can show. ``fallback``: one plain line for notifications
    (None: the text of its sections)."""

    title: str | None = None
    body: tuple[Part, ...] = ()
    fallback: str | None = None
    kind: Kind = Kind.MESSAGE

    @property
    def sections(self) -> tuple[Section, ...]:
        return tuple(p for p in self.body if isinstance(p, Section))

    @property
    def actions(self) -> tuple[Action, ...]:
        out: list[Action] = []
        for p in self.body:
            if isinstance(p, Actions):
                out.extend(p.actions)
            elif isinstance(p, Section) and p.accessory is not None:
                out.append(p.accessory)
        return tuple(out)

    @property
    def people(self) -> tuple[Mention, ...]:
        """Return every person the message names, in order, each once."""
        return tuple(dict.fromkeys(s for s in self.spans() if isinstance(s, Mention)))

    def spans(self) -> Iterator[Span]:
        """Yield every span of the message's text, nested ones included."""
        for p in self.body:
            if isinstance(p, Section):
                yield from walk(p.text)
            elif isinstance(p, Context):
                for t in p.parts:
                    yield from walk(t)


def walk(text: Text) -> Iterator[Span]:
    """Yield each span of ``text`` and of the spans nested in it."""
    for s in text:
        yield s
        if isinstance(s, Strong | Emph | Struck | Clipped):
            yield from walk(s.parts)


def paragraph(text: str) -> Text:
    """Return core sentences, one a line (their literals marked with ``core.text.code``)."""
    return lines(*((Sentence(line),) for line in text.split("\n")))


def note(*spans: Span, title: str | None = None, fallback: str | None = None) -> Message:
    """Return a short message: one section (usage errors, notices)."""
    return Message(title, (Section(spans),), fallback)
