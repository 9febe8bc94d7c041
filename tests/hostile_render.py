"""Hostile names as the probe reads them, and a small checker of Slack's mrkdwn rules.

The inputs go through the parsers a real node's answer goes through: ``/proc`` lines
(``parse_proc_lines``: argv, comm, the cgroup text, user names from the node's user database),
``scontrol show job`` (``parse_scontrol``) and ``docker inspect`` (``parse_docker_inspect``),
then ``apply_enrichment``, the probe's own ``_gpu_process``, ``plan_reset``, ``classify`` and
``find``. Every name a node user controls carries a formatting payload.

``mrkdwn_problems`` reads a mrkdwn text as Slack does (https://api.slack.com/reference/surfaces/
formatting): fenced blocks, then per line code spans, ``<…>`` tags and entities, and the
``*bold*``/``_italic_``/``~strike~`` spans of the rest, each opening after a start, space or
punctuation and closing before one. It reports what a name could make Slack do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gpubot.core.enrich import apply_enrichment
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.probe.fields import parse_proc_lines
from gpubot.core.probe.snapshot import _gpu_process
from gpubot.core.runtimes.docker import parse_docker_inspect
from gpubot.core.runtimes.slurm import parse_scontrol

ATTACK = "pre-approved by on-call"
JOB = f"x` *{ATTACK}* `y"  # issue 21's hostile case 5, as a Slurm job name
FORGED = "✅ Approved by security"  # what a newline in a name would put on a line of its own
CONTAINER = f"c`*{ATTACK}*`_itsfine_ ~struck~ <!channel> & <@U0BOSS>\n{FORGED}"
IMAGE = f"img:`*{ATTACK}*` <https://evil.example|click> &amp;"
LDAP_USER = f"eve\n{FORGED} *{ATTACK}*"  # a user database may hold any name
ARGV = [
    "python",
    "don`t",  # one back-tick: it pairs with the next one in any sentence that is not marked
    f"`*{ATTACK}*`",
    "_itsfine_",
    "~struck~",
    "<!here>",
    "&",
    f"\n{FORGED}",
    "\x1b]0;owned\x07",
    "\x1b[2J",
]
COMM = f"*{ATTACK[:12]}*"  # 14 bytes: comm holds 15
NOTE = f"> *{ATTACK}* <!channel>\n{FORGED}"
FAILED = f"> `*{ATTACK}*` <!channel> _itsfine_\n{FORGED}"
# Text only a name carries: none of it may end up formatted, or raw outside a code span.
HOSTILE_WORDS = ("pre-approved", "pre-appro", "itsfine", "struck", "Approved by security")
HOSTILE_RAW = (f"*{ATTACK}*", f"*{ATTACK[:12]}*", "_itsfine_", "~struck~")

DOCKER_ID = "f" * 64
NOW = 1_700_000_000.0


def _field(text: str) -> str:
    """Encode ``text`` as the probe's script does: ``=`` then printable ASCII and ``\\ooo``."""
    out = []
    for b in text.encode():
        c = chr(b)
        out.append(c if "!" <= c <= "~" and c != "\\" else f"\\{b:03o}")
    return "=" + "".join(out)


def _proc_line(pid: int, uid: int, cgroup: str, state: str = "S") -> str:
    cmd = _field("\0".join(ARGV) + "\0")
    return f"p {pid} {state} 1 {1000 + pid} {uid} {uid} {_field(COMM)} {cmd} ! {_field(cgroup)} =0"


SLURM_CG = "5:memory:/slurm/uid_30000/job_4242/step_0\n0::/system.slice/slurmd.service\n"
DOCKER_CG = f"0::/system.slice/docker-{DOCKER_ID}.scope\n"
SESSION_CG = "0::/user.slice/user-30001.slice/session-3.scope\n"


def scontrol_output() -> str:
    """What gpubot's Slurm lookup prints for job 4242 (Slurm's ``_sprint_job_info``)."""
    record = (
        f"JobId=4242 JobName={JOB}\n   UserId=alice(30000) GroupId=lab(500) MCS_label=N/A\n"
        "   JobState=RUNNING Reason=None Dependency=(null)\n   NodeList=node1\n"
    )
    return f"\n@gpubot-job 4242\n{record}\n@gpubot-end\n"


def docker_output() -> str:
    """What ``docker inspect`` prints for the container (Engine API shape, trimmed)."""
    obj = {
        "Id": DOCKER_ID,
        "Name": "/" + CONTAINER,
        "HostConfig": {"RestartPolicy": {"Name": "always"}},
        "Config": {"Image": IMAGE, "Labels": {"owner": "bob", f"l`*{ATTACK}*`": IMAGE}},
    }
    return json.dumps([obj])


def processes() -> tuple[GpuProcess, ...]:
    """Three GPU processes: a Slurm job's, a container's, and a session's of an LDAP user."""
    body = "\n".join(
        [
            "c 100 5000.0",
            _proc_line(4242, 30000, SLURM_CG),
            _proc_line(4343, 30002, DOCKER_CG),
            _proc_line(4444, 30001, SESSION_CG, state="Z"),
            f"u 30000 {_field('alice')}",
            f"u 30002 {_field('bob')}",
            f"u 30001 {_field(LDAP_USER)}",
        ]
    )
    infos = parse_proc_lines(body, [4242, 4343, 4444])
    job = parse_scontrol(scontrol_output(), ["4242"])["4242"]
    box = parse_docker_inspect(docker_output(), [DOCKER_ID])[DOCKER_ID]
    names = {30000: "alice", 30001: LDAP_USER, 30002: "bob"}
    out = []
    for gpu, (pid, found) in enumerate(((4242, job), (4343, box), (4444, None))):
        info = infos[pid]
        w = info.workload
        if w is not None and found is not None:
            w = apply_enrichment(w, found, "owner", names)
        proc = _gpu_process(pid, gpu, 30_000, True, True, info)
        out.append(GpuProcess(**{**proc.__dict__, "workload": w}))
    return tuple(out)


def snapshot(node: str = "node1") -> NodeSnapshot:
    """A node whose three GPUs are held by the hostile processes, with a hostile note."""
    gpus = tuple(
        GpuInfo(
            i,
            f"GPU-{i}",
            "NVIDIA H100 80GB HBM3",
            30_000,
            81920,
            0,
            bus_id=f"00000000:0{i}:00.0",
            minor=i,
        )
        for i in range(3)
    )
    return NodeSnapshot(node, NOW, gpus, processes(), notes=(NOTE,))


# --- reading what was rendered -----------------------------------------------------------------


def texts(msg: Any) -> Iterator[tuple[str, str]]:
    """Yield ``(kind, text)`` of every text in a message or view: ``mrkdwn`` (the top-level
    ``text`` too), ``plain_text`` and ``raw_text``."""
    if isinstance(msg, Mapping):
        if isinstance(msg.get("text"), str) and msg.get("type") in (None, "home"):
            yield "mrkdwn", msg["text"]  # a message's fallback text is mrkdwn too
        kind = msg.get("type")
        if kind in ("mrkdwn", "plain_text", "raw_text") and isinstance(msg.get("text"), str):
            yield kind, msg["text"]
        for k, v in msg.items():
            if k != "text" or not isinstance(v, str):
                yield from texts(v)
    elif isinstance(msg, list | tuple):
        for v in msg:
            yield from texts(v)


FENCE = "```"
TAG = re.compile(r"<(?:@U[A-Z0-9]+|#C[A-Z0-9]+|!date\^\d+\^[^<>|]*\|[^<>|]*)>")
ENTITY = re.compile(r"&(?:amp|lt|gt);")
_EDGE = r"\s()\[\]{}'\"“”‘’…:;,.!?·—–-"
FORMAT = re.compile(rf"(?:^|(?<=[{_EDGE}]))([*_~])(?=\S)(.+?)(?<=\S)\1(?=$|[{_EDGE}])")


def mrkdwn_problems(text: str) -> list[str]:
    """Return what, in ``text``, a name makes Slack do: a formatting span over a name's words,
    a name's raw formatting outside code, a tag or bare ``&``, an open span or block, a block
    quote, a forged line."""
    parts = text.split(FENCE)
    problems = [] if len(parts) % 2 else ["a preformatted block is not closed"]
    for i, part in enumerate(parts):
        if i % 2:
            problems += ["a back-tick inside a block"] if "`" in part else []
            problems += _forged(part)
            continue
        for line in part.split("\n"):
            problems += _line_problems(line)
    return problems


def _line_problems(line: str) -> list[str]:
    out = []
    bare = TAG.sub("", line)
    if "<" in bare or ">" in bare:
        out.append(f"a raw < or > (a mention or link): {line!r}")
    if "&" in ENTITY.sub("", bare):
        out.append(f"a bare &: {line!r}")
    segs = line.split("`")
    if len(segs) % 2 == 0:
        out.append(f"an odd number of back-ticks (a span left open): {line!r}")
    outside = "".join(s if k % 2 == 0 else "CODE" for k, s in enumerate(segs))
    for m in FORMAT.finditer(outside):
        if any(w in m[2] for w in HOSTILE_WORDS):
            out.append(f"{m[1]} formats a name's words: {m[0]!r}")
    out += [f"a name's {r!r} outside code" for r in HOSTILE_RAW if r in outside]
    if re.match(r"\s*(?:&gt;|>)", line):
        out.append(f"a block quote: {line!r}")
    return out + _forged(line)


def _forged(text: str) -> list[str]:
    return [f"a forged line: {ln!r}" for ln in text.split("\n") if ln.lstrip().startswith(FORGED)]


def message_problems(msg: Any) -> list[str]:
    """Return every problem of every text of ``msg`` (plain and raw text: one line each)."""
    out = []
    for kind, text in texts(msg):
        if kind == "mrkdwn":
            out += mrkdwn_problems(text)
        elif "\n" in text:
            out.append(f"a newline in {kind}: {text!r}")
        out += [f"a control character in {kind}" for c in text if c in "\x1b\x07\r"][:1]
    return out


def terminal_problems(text: str) -> list[str]:
    """Return how a terminal text lets a name forge a line or drive the terminal."""
    out = _forged(text)
    if "\x1b]" in text or "\x1b[2J" in text or "\x07" in text or "\r" in text:
        out.append("an escape sequence of a name reaches the terminal")
    return out
