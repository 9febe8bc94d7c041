"""What a chat front end's ids look like in the settings file, as that front end says.

The settings name people (``[users]``, ``[approvals] approvers``, ``[permissions]``), user
groups and channels of the primary front end, the one with a directory of accounts; its section
(``[NAME]``) holds its channels. Only that front end knows its ids' forms: it registers them here
when imported (the entry imports each front end's forms before reading settings), so this
shared code names no front end. Another front end's people would get tables under its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubot.errors import ConfigError


@dataclass(frozen=True)
class IdForms:
    """One front end's forms of ids, and the words a refusal uses for each."""

    name: str  # the front end; its settings section holds its channels
    user: re.Pattern[str]
    group: re.Pattern[str]
    place: re.Pattern[str]
    user_words: str  # what a user id is, as a refusal says it: "a user id (U…)"
    group_words: str
    place_words: str
    bots: frozenset[str] = frozenset()  # the chat system's own bot accounts: never a person
    primary: bool = True  # the settings' people, groups and channels are this front end's


KNOWN: dict[str, IdForms] = {}


def register(forms: IdForms) -> None:
    """Know ``forms`` (a front end calls this once, when imported)."""
    KNOWN[forms.name] = forms


def primary() -> IdForms | None:
    """Return the primary front end's forms (None: no front end is loaded)."""
    return next((f for f in KNOWN.values() if f.primary), None)


def forms(where: str, key: str) -> IdForms:
    """Return the primary front end's forms, which the setting ``key`` needs to be checked."""
    found = primary()
    if found is None:
        raise ConfigError(f"{where}: {key}: no chat front end is loaded to check its ids")
    return found


def is_person(value: str) -> bool:
    """Whether ``value`` is a user id of any front end loaded: the settings map each front
    end's people to Linux users, and name approvers, in the same tables."""
    return any(f.user.fullmatch(value) for f in KNOWN.values())


def person_words(where: str, key: str) -> str:
    """Return what a person's id is, in every loaded front end's words (for a refusal)."""
    forms(where, key)  # no front end loaded: that is the error
    return " or ".join(f.user_words for f in sorted(KNOWN.values(), key=lambda f: not f.primary))


def reaches(front: str, user: str) -> bool:
    """Whether the front end named ``front`` can message the person ``user``: an id of its own
    form. A front end with no forms of its own (the console) reaches everyone it is given."""
    own = KNOWN.get(front)
    return own is None or own.user.fullmatch(user) is not None


def names(front: str, value: str) -> bool:
    """Whether ``value`` is a person or a group of people of the front end named ``front``: who
    its messages can mention. A front end with no forms of its own mentions any."""
    own = KNOWN.get(front)
    return own is None or bool(own.user.fullmatch(value) or own.group.fullmatch(value))


def has_forms(front: str) -> bool:
    """Whether the front end named ``front`` has ids of its own (the console has none)."""
    return front in KNOWN
