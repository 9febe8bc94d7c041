"""A rendered message handed from one front end's process to another's (``chat.message_codec``)
comes back equal, from the renderers that hand messages over; a ``Place`` and what is not a
message are refused in one line."""

from __future__ import annotations

import pytest

from gpubot.chat import claim_view as view
from gpubot.chat.ladder import render_ladder
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Context,
    Date,
    DateStyle,
    Heading,
    Kind,
    Mention,
    Message,
    Place,
    Pre,
    Section,
    Sentence,
    Style,
    Table,
    bold,
    clipped,
    italic,
)
from gpubot.chat.message_codec import decode, encode
from gpubot.core.claims.rules import Claim, ClaimState, Wait, WaitState
from gpubot.core.usage.ladder import Step
from tests.fixtures.ladder import notice


def every_kind() -> Message:
    """A message holding each span and part of the model (a ``Place`` aside)."""
    ask = Confirm("Free it?", "This stops pid 7.", "Free", style=None)
    text = (
        "plain «ünïcode» 🧹 ",
        Mention("U0ALICE", "alice"),
        Date(1700000000.5, DateStyle.TIME),
        NL,
        bold(Code("!gpu take 7"), italic(Sentence("`x` held"))),
        clipped(12, "a long line that is clipped"),
    )
    return Message(
        "title",
        (
            Heading("head"),
            Section(text, Action("a", "A", "v", Style.DANGER, ask)),
            Pre(("line 1", "line 2")),
            Table((("GPU", "MiB"), ("0", "1")), wrap=(1,), right=(1,), lines=("GPU MiB",)),
            Context((("small", Code("print")), ("more",))),
            Actions((Action("b", "B", "w"), Action("c", "C", "x", Style.PRIMARY)), "group"),
        ),
        "fallback",
        Kind.PAGE,
    )


def handed_over() -> list[Message]:
    """The DMs the claims' duty and the ladder render for a person."""
    w = Wait(7, "node1", (2,), 1, None, "alice", "@a:lab", 0.0, WaitState.OFFERED, (2,), 60.0)
    c = Claim(3, "node1", 2, "GPU-x", "alice", "@a:lab", 0.0, 3600.0, "eval", ClaimState.ACTIVE)
    return [
        view.render_offer(w, ["GPU-x"], hold=True),
        view.render_lapsed(w),
        view.render_expired(c),
        render_ladder(notice(Step.DM, "alice"), ("@a:lab",)),
        render_ladder(notice(Step.REMIND, "alice"), ("U0ALICE",)),
    ]


@pytest.mark.parametrize("msg", [every_kind(), *handed_over()])
def test_a_message_comes_back_equal(msg: Message) -> None:
    again = decode(encode(msg))
    assert again == msg
    assert again.actions == msg.actions and again.people == msg.people


def test_the_model_is_written_by_name_not_pickled() -> None:
    text = encode(every_kind())
    assert '"@":"Mention"' in text and '{"~":"Style","v":"danger"}' in text
    assert "ünïcode" in text  # kept as it is, not escaped


def test_a_place_is_refused_it_names_another_front_ends_message() -> None:
    with pytest.raises(ValueError, match="a Place cannot be shown by another front end"):
        encode(Message(None, (Section(("see ", Place("C0ALERTS/1.2"))),)))


@pytest.mark.parametrize(
    "text",
    [
        '{"@":"Section","text":[]}',  # a part, not a message
        '{"@":"Popen","args":["rm"]}',  # not a class of the model
        '{"@":"Message","title":1,"nope":2}',  # not its fields
        '{"~":"Nope","v":"x"}',
        "[1, 2]",
        "{",  # not JSON
        '{"@":"Message","kind":{"~":"Kind","v":"nope"}}',
    ],
)
def test_what_is_not_a_message_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not a message"):
        decode(text)
