"""Slurm's gpu GRES index to device minor on one node, from its ``gres.conf`` (pure, no I/O).

gres.conf(5) (SchedMD/slurm ``doc/man/man5/gres.conf.5``): ``Key=Value`` words, names case
insensitive, ``#`` starts a comment, a trailing ``\\`` continues the line; ``NodeName=`` (a
hostlist) limits a line to those nodes; ``AutoDetect=`` alone applies to every node, with
``NodeName=`` to those nodes only, and a node's own setting wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpubot.core.slurm import GresMap
from gpubot.core.slurm.parse import MAX_GRES_IDX, SlurmParseError, expand_hostlist

_CONF_KEY = re.compile(r"([A-Za-z]+)=(\S*)")


def gres_map(gres_conf: str, node: str, minors: Iterable[int] = ()) -> GresMap:
    """Slurm's gpu GRES index to device minor on ``node``, from its gres.conf text.

    Proven when autodetection is off for the node and every ``Name=gpu`` line for it has a
    ``File=`` whose names all end in digits (the minor): then index ``i`` is the ``i``-th file
    in the order the lines and their ranges are written. That is Slurm's own numbering
    (SchedMD/slurm ``src/interfaces/gres.c`` ``_foreach_fill_in_gres_devices``: the bitmap
    index counts the files of the merged list in order, ``hostlist_shift`` expanding
    ``File=/dev/nvidia[0-3]``). With ``AutoDetect`` on (``nvml``, ``nvidia``, ``rsmi``,
    ``oneapi``, ``nrt``, ``full``), ``src/plugins/gres/gpu/gres_gpu.c``
    ``_merge_system_gres_conf`` re-sorts the GPUs by file name and then by PCI bus ID, which
    the file text does not tell, so the map is unproven; so is one with ``MultipleFiles=``, no
    ``File=``, an ``Include``, or anything unreadable.

    Unproven, index ``i`` is the ``i``-th of ``minors`` (the node's GPU device minors as probed)
    in ascending order.
    """
    fallback = GresMap(minors=tuple(sorted({m for m in minors if m >= 0})), proven=False)
    files: list[int] = []
    auto_global, auto_node, gpu_lines, bad = "off", None, 0, False
    for line in _conf_lines(gres_conf):
        fields = _conf_fields(line)
        if fields is None:
            bad = True
            continue
        names = fields.get("nodename")
        if names is not None:
            try:
                if node not in expand_hostlist(names):
                    continue
            except SlurmParseError:
                bad = True
                continue
        if "autodetect" in fields:
            if names is None:
                auto_global = fields["autodetect"].lower()
            else:
                auto_node = fields["autodetect"].lower()
        if fields.get("name") != "gpu":
            continue
        gpu_lines += 1
        line_minors = _file_minors(fields)
        if line_minors is None:
            bad = True
        else:
            files.extend(line_minors)
    autodetect = auto_node if auto_node is not None else auto_global
    if bad or not gpu_lines or autodetect != "off" or len(set(files)) != len(files):
        return fallback
    return GresMap(minors=tuple(files), proven=True)


def _conf_lines(conf: str) -> list[str]:
    """gres.conf lines without comments, a trailing ``\\`` joining the next line."""
    out, pending = [], ""
    for raw in conf.splitlines():
        line = pending + raw.split("#", 1)[0]
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.strip():
            out.append(line.strip())
    if pending.strip():
        out.append(pending.strip())
    return out


def _conf_fields(line: str) -> dict[str, str] | None:
    """``Key=Value`` pairs of one line, keys lower-cased; None for a line that is not only
    such pairs (``Include``, a quoted value, a control character ...)."""
    if not line.isprintable():
        return None
    words = line.split()
    fields: dict[str, str] = {}
    for w in words:
        m = _CONF_KEY.fullmatch(w)
        if m is None or m[1].lower() in fields or '"' in w or "'" in w:
            return None
        fields[m[1].lower()] = m[2]
    return fields


def _file_minors(fields: Mapping[str, str]) -> list[int] | None:
    """The minors of a gpu line's ``File=`` names in order; None when not proven by them."""
    file = fields.get("file")
    if file is None or "multiplefiles" in fields:
        return None
    try:
        paths = expand_hostlist(file, most=MAX_GRES_IDX + 1)
    except SlurmParseError:
        return None
    out: list[int] = []
    for p in paths:
        # a GPU's own device file (/dev/nvidiaN, or a folder's nvidiaN): never nvidia-capN, a
        # MIG capability, whose digits are no GPU's minor
        m = re.fullmatch(r"/(?:\S*/)?nvidia([0-9]{1,6})", p)
        if m is None:
            return None
        out.append(int(m[1]))
    count = fields.get("count")
    if count is not None and count != str(len(out)):
        return None
    return out
