"""Matrix's rendering of the hostile inputs (``tests.hostile_render``): the HTML a client shows
carries only gpubot's own tags, a node user's names stay text, and neither the HTML nor the
plain ``body`` lets a name forge a line. The controls show each defence is what holds."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

from gpubot.chat import fleet_view, reset_view
from gpubot.chat.message import Action, Mention, Message, Section
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.matrix import render
from tests import hostile_render as h

OURS = {"h3", "h4", "p", "small", "strong", "em", "del", "code", "pre", "br", "a"}
OURS |= {"table", "thead", "tbody", "tr", "th", "td"}
NOW_TS = 1_700_000_000.0
HTML_ATTACK = f'<img src=x onerror=alert(1)><a href="https://evil.example">{h.ATTACK}</a>'


class Tags(HTMLParser):
    """Every tag and its attributes, and the text, as a client's HTML parser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def read(html: str) -> Tags:
    t = Tags()
    t.feed(html)
    t.close()
    return t


def hostile() -> dict[str, Message]:
    plan = plan_reset(h.snapshot(), ResetRequest("node1", "dave", gpus=(0, 1, 2)), Protection())
    asker = "@dave:lab.example"
    return {
        "request": reset_view.render_approval_request(12, plan, asker, "dave", NOW_TS + 900),
        "node": fleet_view.render_node(h.snapshot()),
        "fleet": fleet_view.render_fleet([h.snapshot(), h.snapshot("node3")], {"node2": h.FAILED}),
        "note": Message(
            h.NOTE, (Section((h.CONTAINER, HTML_ATTACK, Mention(h.LDAP_USER, h.LDAP_USER))),)
        ),
    }


def problems(content: dict[str, Any]) -> list[str]:
    out = []
    tags = read(content["formatted_body"])
    for tag, attrs in tags.tags:
        if tag not in OURS:
            out.append(f"a tag not gpubot's: <{tag}>")
        if tag == "a" and [k for k, _ in attrs] != ["href"]:
            out.append(f"a link with {attrs}")
        if tag == "a" and not str(dict(attrs)["href"]).startswith("https://matrix.to/#/@"):
            out.append(f"a link elsewhere: {attrs}")
    shown = "".join(tags.text)
    out += [f"HTML: {p}" for p in h.terminal_problems(shown)]
    out += [f"body: {p}" for p in h.terminal_problems(content["body"])]
    return out


@pytest.mark.parametrize("name", sorted(hostile()))
def test_no_name_makes_markup_or_forges_a_line_on_matrix(name: str) -> None:
    content = render.to_matrix(hostile()[name])
    assert any(w in content["body"] for w in h.HOSTILE_WORDS)  # the check is not vacuous
    assert problems(content) == []


def test_the_request_names_both_people_and_carries_its_id() -> None:
    content = render.to_matrix(hostile()["request"])
    assert content[render.APPROVAL_KEY] == 12 and content["msgtype"] == "m.notice"
    assert '<a href="https://matrix.to/#/@dave:lab.example">' in content["formatted_body"]
    assert "react ✅ or type !gpu approve 12" in content["body"]
    assert "processes of `alice`" in content["body"]  # the owners


def test_an_edit_replaces_the_event_and_carries_no_id() -> None:
    edit = render.edit_of("$e1", hostile()["request"])
    assert edit["m.relates_to"] == {"rel_type": "m.replace", "event_id": "$e1"}
    assert edit["body"].startswith("* ") and render.APPROVAL_KEY not in edit["m.new_content"]


def test_control_without_escaping_a_name_makes_a_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "escape", lambda s, quote=True: s)
    said = problems(render.to_matrix(hostile()["note"]))
    assert "a tag not gpubot's: <img>" in said
    assert any("a link elsewhere" in p for p in said)


def test_control_without_one_line_a_name_forges_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "one_line", lambda s: s)
    said = problems(render.to_matrix(hostile()["note"]))
    assert any("body: " in p and "forged" in p for p in said), said


def test_the_alert_and_ladder_buttons_say_what_to_type() -> None:
    from gpubot.chat.alerts import snooze_buttons
    from gpubot.chat.idle import free_button
    from gpubot.chat.ladder import ACTION_KEEP, oncall_free_button
    from gpubot.chat.message import Action, Actions

    key = '["node1","0","idle-holder","42:7"]'
    acts = (
        free_button(key, "node1", 0, "42"),
        *snooze_buttons(key),
        Action(ACTION_KEEP, "Keep (reason)", key),
        oncall_free_button(key, "node1", 0),
    )
    plain = render.to_matrix(Message(None, (Actions(acts),)))["body"]
    assert plain == (
        f"Free it: !gpu free {key} · Snooze 1 h: !gpu snooze 1h {key} · "
        f"Snooze 1 day: !gpu snooze 1d {key} · Keep (reason): !gpu keep {key} because REASON"
        f" · Free it (on-call): !gpu oncall-free {key}"
    )


def test_the_claims_buttons_say_the_words_that_do_the_same() -> None:
    """Claim / Leave / Queue me / Release are the claims' own commands; Keep and an intruder's
    Free it are typed buttons; a ``/gpu`` command the message quotes reads ``!gpu``."""
    from gpubot.chat import claim_view as view
    from gpubot.core.claims.rules import Claim, Wait, WaitState

    w = Wait(7, "node1", (2,), 1, None, "alice", "@a:lab", 0.0, WaitState.OFFERED, (2,), 60.0)
    offer = render.to_matrix(view.render_offer(w, ["GPU-x"], hold=True))["body"]
    assert "or type `!gpu take 7`." in offer and "/gpu" not in offer
    assert "Claim: !gpu take 7 · Leave the queue: !gpu leave 7" in offer
    c = Claim(5, "node1", 2, "GPU-x", "bob", "@b:lab", 0.0, 3600.0, "")
    asked = render.to_matrix(view.render_idle_asked(c, 1200))["body"]
    assert "Keep: !gpu keep claim 5 · Release: !gpu release node1 gpu 2" in asked
    old = Action(view.ACTION_RELEASE, "Release", "5")  # posted before the value named the GPU
    assert render.typed(old) is None  # never a bare "!gpu release", which ends every claim
    key = '["node1","2","claim-intruder","42:7"]'
    free = render.typed(Action(view.ACTION_FREE_INTRUDER, "Free it", key))
    assert free == f"!gpu free {key}"
    granted = render.to_matrix(view.render_granted([c]))["body"]
    assert "`!gpu extend` makes it last longer; `!gpu release` ends it." in granted
    join = Action(view.ACTION_JOIN, "Queue me", "wait node1 gpu 3 for 1h")
    assert render.typed(join) == "!gpu wait node1 gpu 3 for 1h"
