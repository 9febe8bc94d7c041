"""What a chat front end's ids look like in the settings file, as that front end says.

The settings name a front end's people (``[users]``, ``[approvals] approvers``,
``[permissions]``), user groups (``[approvals] usergroup``, ``[teams]``) and places (channels).
Only the front end that issues an id knows its form: it registers its ``IdForms`` here when
imported (the composition root imports each front end's forms before any settings are read),
so that this shared code knows no front end by name.

Those tables hold the ids of the primary front end, the one with a directory of accounts; its
section (``[NAME]``) holds its channels. Another front end's people would get tables of their
own under its name (``[NAME.users]``), validated by its own forms.
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
