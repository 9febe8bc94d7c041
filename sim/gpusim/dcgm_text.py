"""What a simulated fleet's dcgm-exporters would serve: one recorded exporter text, copied per GPU.

A recorded sample (one GPU's ``/metrics``, kept verbatim by the caller) is served as every GPU of
every node given: each sample line copied per GPU, its ``Hostname``, ``gpu``, ``UUID``,
``device`` and ``pci_bus_id`` those of the simulated GPU (``node_layout``), its value the
sample's unless the caller names one. Fields the sample lacks can be added at 0, in the labels of
its ``DCGM_FI_DEV_FB_USED`` line. Metric families stay together, each after its HELP and TYPE.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from gpusim.node_layout import bus_id, gpu_uuid

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
GpuValues = Mapping[str, float]  # a metric's name: the value a GPU serves instead of the sample's


def fleet_text(
    sample: str,
    gpus: Mapping[str, int],
    values: Mapping[tuple[str, int], GpuValues] | None = None,
    *,
    added: Sequence[str] = (),
    keep: Collection[str] | None = None,
) -> str:
    """``sample`` served as every GPU of ``gpus`` (node: GPU count), in one text; ``added``:
    fields the sample lacks, served as gauges at 0 unless named; ``keep``: only these metrics."""
    lines = sample.splitlines()
    families: dict[str, tuple[list[str], dict[str, str], str]] = {}
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        head = [ln for ln in lines if _is_header(ln, m["name"])]
        families[m["name"]] = (head, dict(_LABEL.findall(m["labels"] or "")), m["value"])
    _, labels, _ = families["DCGM_FI_DEV_FB_USED"]
    for name in added:
        families[name] = ([f"# TYPE {name} gauge"], labels, "0")
    out: list[str] = []
    for name, (head, labels, value) in families.items():
        if keep is not None and name not in keep:
            continue
        out += head
        for node, count in gpus.items():
            for g in range(count):
                own = {"gpu": str(g), "UUID": gpu_uuid(node, g), "device": f"nvidia{g}"}
                own |= {"pci_bus_id": bus_id(g), "Hostname": node}
                said = ",".join(f'{k}="{own.get(k, v)}"' for k, v in labels.items())
                served = (values or {}).get((node, g), {}).get(name)
                out.append(f"{name}{{{said}}} {value if served is None else f'{served:g}'}")
    return "\n".join(out) + "\n"


def _is_header(line: str, name: str) -> bool:
    return line.startswith(("# HELP ", "# TYPE ")) and line.split()[2] == name
