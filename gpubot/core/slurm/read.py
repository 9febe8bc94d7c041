"""Reading Slurm over a node's SSH: one exec that asks ``sinfo --json`` for the node,
``squeue --json`` for the jobs and reads the ``gres.conf`` beside ``slurm.conf``, and the parse of
its answer into a ``SlurmView``.

Both print OpenAPI's records (v0.0.38 on 22.05, the version ``scontrol`` has no ``--json``) and
ignore filters there, so the node and its jobs are picked here; on a large cluster this is the
whole queue each time (slurmrestd, where a site runs it, is the way to ask less).
JSON strings hold no raw newline: a job's owner cannot
forge the script's marker lines (``@gpubot-slurm PART``), which must come exactly in order.
Each part ends with its command's exit status (and, when it failed, its error output): a part
whose command failed is said in the view's error, never read as "no jobs". A warning on a
command's error output never mixes into its JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gpubot.core.slurm import GresMap, SlurmView
from gpubot.core.slurm.gresconf import gres_map
from gpubot.core.slurm.parse import SlurmParseError, jobs_on, node_state
from gpubot.core.text import one_line

PARTS = ("node", "jobs", "gres")
SCRIPT = r"""t=$1
exec 3>&1
part() {
  printf '@gpubot-slurm %s\n' "$1"; shift
  e=$("$@" 2>&1 1>&3 3>&-); r=$?
  [ "$r" = 0 ] || printf '%s' "$e"
  printf '\n@gpubot-slurm rc %s\n' "$r"
}
part node timeout -k 1 "$t" sinfo --all --json
part jobs timeout -k 1 "$t" squeue --all --json
c=$(timeout -k 1 "$t" scontrol show config 2>/dev/null | sed -n 's/^SLURM_CONF *= *//p')
part gres cat -- "${c%/*}/gres.conf"
"""
# gres.conf alone, beside a read through slurmrestd (which does not serve it).
GRES_SCRIPT = r"""t=$1
c=$(timeout -k 1 "$t" scontrol show config 2>/dev/null | sed -n 's/^SLURM_CONF *= *//p')
exec cat -- "${c%/*}/gres.conf"
"""
SSH_SOURCE = "sinfo/squeue --json"
_MARK = re.compile(r"@gpubot-slurm (node|jobs|gres|rc (-?[0-9]{1,3}))")


def read_argv(timeout_s: float) -> list[str]:
    """Return the argv of the read."""
    t = f"{timeout_s:.3f}".rstrip("0").rstrip(".")
    return ["sh", "-c", SCRIPT, "gpubot-slurm", t]


def gres_argv(timeout_s: float) -> list[str]:
    """Return the argv that prints the node's gres.conf (exit 0 only when it was read)."""
    t = f"{timeout_s:.3f}".rstrip("0").rstrip(".")
    return ["sh", "-c", GRES_SCRIPT, "gpubot-slurm-gres", t]


def split(stdout: str) -> dict[str, tuple[str, int]] | None:
    """Return each part's text and exit status; None unless the markers are exactly the
    script's (every part, in order, each with its status)."""
    out: dict[str, tuple[str, int]] = {}
    part: str | None = None
    lines: list[str] = []
    order: list[str] = []
    for line in stdout.removesuffix("\n").split("\n"):
        m = _MARK.fullmatch(line)
        if m is None:
            if part is None:
                return None
            lines.append(line)
        elif m[2] is None:
            if part is not None:
                return None
            part, lines = m[1], []
            order.append(part)
        else:
            if part is None:
                return None
            out[part] = ("\n".join(lines), int(m[2]))
            part = None
    if part is not None or tuple(order) != PARTS:
        return None
    return out


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise SlurmParseError(f"{what}: not JSON ({one_line(text.strip())[:120]})") from None


def parse_read(stdout: str, slurm_node: str, minors: Sequence[int], taken_at: float) -> SlurmView:
    """Return the view of one read: ``minors`` are the node's GPUs' device minors (for the
    GRES map when ``gres.conf`` does not prove one)."""
    parts = split(stdout)
    source = SSH_SOURCE
    if parts is None:
        return SlurmView(None, (), taken_at, source, error="the answer was not the script's")
    failed = [
        f"{name}: {one_line(text.strip())[:200] or f'exit {rc}'}"
        for name, (text, rc) in parts.items()
        if rc != 0 and name != "gres"
    ]
    if failed:
        return SlurmView(None, (), taken_at, source, error="; ".join(failed))
    try:
        node = node_state(_json(parts["node"][0], "sinfo --json"), slurm_node)
        jobs = jobs_on(_json(parts["jobs"][0], "squeue --json"), slurm_node)
    except SlurmParseError as exc:
        return SlurmView(None, (), taken_at, source, error=str(exc))
    text, rc = parts["gres"]
    gres: GresMap = gres_map(text if rc == 0 else "", slurm_node, minors)
    return SlurmView(node, jobs, taken_at, source, gres=gres)
