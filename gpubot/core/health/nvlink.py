"""Which NVLink links each GPU should have up: its expected link set (pure).

``nvidia-smi nvlink -s`` lists every link a GPU has, wired or not, and a link that is not up
reads ``<inactive>`` either way: two H100 PCIe joined by NVLink bridges show 12 of 18 links up
each by design (topology NV12), while a V100 with 2 of its 6 mesh links down shows the same kind
of answer (Azure/azhpc-diagnostics#73). ``nvidia-smi topo -m`` does not tell them apart either:
its ``NV#`` counts the links up now, so a pair whose links went down reads as no NVLink at all
(Azure/azhpc-images#443: "Nvidia topology shows no nv links" until a reboot). What a GPU should
have up is therefore learned, never read from one answer:

- the links this GPU (by UUID) has been seen with up since gpubot started (alerting sweeps'
  memory, ``seen``): a link that was up and is not is down;
- in an NVSwitch fabric (its GPUs say a fabric state), every GPU of one model on the node is
  wired to the switches alike: the links its peers of that model have up, or had, are its own.
  This is what finds a GPU whose links are all down (NVML's "all links are inActive") at the
  first reading, beside a peer with 18 up (leptonai/gpud#1085).

Outside a fabric, a GPU never seen with a link up has no expected set (None): bridged PCIe cards
may be wired in any pairs, and a card without a bridge is no fault. The set is not kept across
restarts: after one, it is learned again from the first reading (and the fabric's peers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpubot.core.health.state import GpuHealth, NodeHealth
from gpubot.core.models import GpuInfo

LinkKey = tuple[str, str]  # (node, GPU uuid)


def expect_links(
    node: str,
    gpus: Iterable[GpuInfo],
    health: NodeHealth,
    seen: Mapping[LinkKey, tuple[int, ...]],
) -> NodeHealth:
    """Return ``health`` with each GPU's expected links (``Links.expected``) set."""
    info = {g.index: g for g in gpus}
    known: dict[int, set[int]] = {}
    for i, h in health.gpus.items():
        g = info.get(i)
        if h.links is None or g is None:
            continue
        own = set(seen.get((node, g.uuid), ())) | set(h.links.up) | set(h.links.expected or ())
        known[i] = own
    if health.in_fabric:
        by_model: dict[str, set[int]] = {}
        for i, links in known.items():
            by_model.setdefault(info[i].name, set()).update(links)
        known = {i: links | by_model[info[i].name] for i, links in known.items()}
    out: dict[int, GpuHealth] = dict(health.gpus)
    for i, links in known.items():
        h = health.gpus[i]
        assert h.links is not None
        expected = tuple(sorted(links)) if links else None
        if expected != h.links.expected:
            out[i] = replace(h, links=replace(h.links, expected=expected))
    return replace(health, gpus=out)


def learn_links(
    node: str,
    gpus: Iterable[GpuInfo],
    health: NodeHealth,
    seen: Mapping[LinkKey, tuple[int, ...]],
) -> dict[LinkKey, tuple[int, ...]]:
    """Return ``seen`` with the links each GPU of ``node`` has up now added."""
    out = dict(seen)
    for g in gpus:
        h = health.gpus.get(g.index)
        if h is None or h.links is None or not h.links.up:
            continue
        key = (node, g.uuid)
        now = tuple(sorted(set(out.get(key, ())) | set(h.links.up)))
        if now != out.get(key):
            out[key] = now
    return out
