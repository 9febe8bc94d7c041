"""What the JSON runtimes (docker, podman, crictl) share: reading ``inspect`` output.

Everything a runtime prints about a workload is hostile: its owner chose the container's name,
image and labels. The JSON runtimes escape that text themselves; it lands on a workload only
through ``printable`` (``core.text.one_line``) and a length cap. Any doubt drops the record
(an id printed twice is no id's): that workload's name is unknown, never someone else's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpubot.core.runtimes.base import HEX64_ID, Found, Workload
from gpubot.core.text import cut, one_line

MAX_TEXT = 200  # characters of one name, image or label value kept
MAX_LABELS = 8  # labels kept on a workload, besides the owner label

_WS = re.compile(r"\s*")


def json_items(text: str) -> list[dict[str, Any]]:
    """Return the objects of every JSON value in ``text`` (arrays flattened); stop at junk."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i = 0
    while True:
        m = _WS.match(text, i)
        i = m.end() if m else i
        if i >= len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return out
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, dict):
                out.append(v)


def parser(
    key: Callable[[dict[str, Any]], object], build: Callable[[dict[str, Any]], Found]
) -> Callable[[str, Sequence[str]], dict[str, Found]]:
    """Return the parse of an inspect output: a record for each asked id that exactly one of
    its objects carries (``key``); an id seen twice is dropped."""

    def parse(stdout: str, ids: Sequence[str]) -> dict[str, Found]:
        asked = {i for i in ids if isinstance(i, str) and HEX64_ID.fullmatch(i)}
        seen: dict[str, list[dict[str, Any]]] = {}
        for o in json_items(stdout):
            k = key(o)
            if isinstance(k, str) and k in asked:
                seen.setdefault(k, []).append(o)
        return {k: build(found[0]) for k, found in seen.items() if len(found) == 1}

    return parse


def at(o: object, *path: str) -> object:
    """Return the value at ``path`` in nested objects, or None."""
    for p in path:
        if not isinstance(o, dict):
            return None
        o = o.get(p)
    return o


def text(v: object) -> str | None:
    """Return ``v`` marked by ``printable`` and capped at MAX_TEXT; None unless a non-empty str."""
    if not isinstance(v, str) or not v:
        return None
    t = one_line(v)
    return cut(t, MAX_TEXT)


def labels(v: object) -> tuple[tuple[str, str], ...]:
    """Return every string label, sorted; a key too long to keep whole is left out."""
    if not isinstance(v, dict):
        return ()
    out: dict[str, str] = {}
    for k, val in v.items():
        key = one_line(k) if isinstance(k, str) else ""
        if key and len(key) <= MAX_TEXT and isinstance(val, str):
            out[key] = text(val) or ""
    return tuple(sorted(out.items()))


def inspect_argv(tool: str) -> Callable[[Sequence[str], Sequence[str]], list[str]]:
    """``[sudo -n] TOOL inspect --type container ID...`` (docker's and podman's form)."""

    def argv(ids: Sequence[str], sudo: Sequence[str]) -> list[str]:
        return [*sudo, tool, "inspect", "--type", "container", *ids]

    return argv


def rootful_id(w: Workload) -> str | None:
    """The id the system's daemon knows: a rootless container's it does not (and its owner comes
    from its user slice anyway)."""
    return None if w.get("rootless") else w.id


def apply_container(w: Workload, found: Found, owner_label: str | None) -> Workload:
    """Put a docker or podman record on ``w``: name, image, restart policy and labels."""
    values = label_values(found, owner_label)
    values["restart"] = found.restart
    return replace(w, name=found.name or w.name).with_detail(**values)


def label_values(found: Found, owner_label: str | None) -> dict[str, str | None]:
    """The image and at most MAX_LABELS labels of a record, the owner label always kept."""
    keep = [kv for kv in found.labels if kv[0] != owner_label][:MAX_LABELS]
    keep += [kv for kv in found.labels if kv[0] == owner_label]
    values: dict[str, str | None] = {f"label.{k}": v for k, v in keep}
    values["image"] = found.image
    return values
