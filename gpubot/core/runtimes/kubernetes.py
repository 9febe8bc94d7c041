"""Kubernetes: the kubelet's pods, whatever CRI runtime runs their containers.

Cgroup shapes (kubernetes.io "cgroup drivers"): ``/kubepods.slice/kubepods-QOS.slice/
kubepods-QOS-podUID.slice/cri-containerd-ID.scope`` (systemd), ``/kubepods/QOS/podUID/ID``
(cgroupfs); kind's ``--cgroup-root=/kubelet`` (``/kubelet.slice/kubelet-kubepods.slice/...``,
``/kubelet/kubepods/...``). A static pod's UID is 32 hex digits (the manifest's hash).
containerd with ``SystemdCgroup = false`` under a kubelet using the systemd driver: the CRI
plugin writes the cgroupsPath as ``slice:cri-containerd:ID`` and runc's cgroupfs manager takes
it as a path below containerd's own cgroup:
``/system.slice/containerd.service/kubepods-QOS-podUID.slice:cri-containerd:ID``.

Lookup: ``crictl inspect ID...``: current versions print one ``{"status": ..., "info": ...}``
object for one id and a JSON array for several, and nothing at all when any id is not found;
older versions printed one object per id, concatenated. ``status`` is the CRI ``ContainerStatus``
in protojson names: ``id``, ``metadata.name``, ``image.image``, ``labels``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpubot.core import text
from gpubot.core.runtimes import inspect_json
from gpubot.core.runtimes.base import (
    HEX64,
    HEX64_ID,
    NEST,
    ROOT_SLICES,
    Found,
    Lookup,
    Runtime,
    Shape,
    Workload,
    always,
    container_owner,
    owned,
)

# A pod UID: 36 characters (the systemd driver writes its dashes as underscores), or 32 hex
# digits without dashes (a static pod's UID is a hash of its manifest: CRI-O's and kubeadm's).
_POD = r"(?:[0-9a-f_-]{36}|[0-9a-f]{32})"
_QOS = r"(?:-(?P<qos>besteffort|burstable))?"
_RT = r"(?P<rt>cri-containerd|crio|docker)"
_RUNTIME = {"cri-containerd": "containerd", "crio": "cri-o"}


def _found(o: dict[str, Any]) -> Found:
    labels = inspect_json.at(o, "status", "labels")
    get = (labels if isinstance(labels, dict) else {}).get
    image = inspect_json.at(o, "status", "image", "image")
    return Found(
        name=inspect_json.text(inspect_json.at(o, "status", "metadata", "name")),
        image=inspect_json.text(image)
        or inspect_json.text(inspect_json.at(o, "status", "imageRef")),
        labels=inspect_json.labels(labels),
        namespace=inspect_json.text(get("io.kubernetes.pod.namespace")),
        pod=inspect_json.text(get("io.kubernetes.pod.name")),
        pod_uid=inspect_json.text(get("io.kubernetes.pod.uid")),
    )


# One object, an array, or objects one after another (see the module docstring).
parse_crictl_inspect = inspect_json.parser(lambda o: inspect_json.at(o, "status", "id"), _found)


def _build(kind: str, path: str, g: Mapping[str, str]) -> Workload:
    pod = g["pod"].replace("_", "-")
    return Workload(kind, g.get("id") or pod).with_detail(
        pod_uid=pod,
        qos=g.get("qos", "guaranteed"),
        runtime=_RUNTIME.get(g.get("rt", "")) or g.get("rt"),
        container_id=g.get("id"),
    )


def _describe(w: Workload) -> str:
    pod = w.name or f"pod {w.get('pod_uid') or '?'}"
    return f"Kubernetes pod {text.code(pod)}{owned(w)}"


def _container_id(w: Workload) -> str | None:
    return w.get("container_id")


def _apply(w: Workload, found: Found, owner_label: str | None) -> Workload:
    values = inspect_json.label_values(found, owner_label)
    ns, pod = found.namespace, found.pod
    name = f"{ns}/{pod}" if ns and pod else pod
    values.update(namespace=ns, pod=pod, container=found.name)
    return replace(w, name=name or w.name).with_detail(**values)


def _contradicts(w: Workload, found: Found) -> bool:
    pod = w.get("pod_uid")
    return pod is not None and found.pod_uid is not None and pod != found.pod_uid


def _crictl(ids: Sequence[str], sudo: Sequence[str]) -> list[str]:
    return [*sudo, "crictl", "inspect", *ids]


RUNTIME = Runtime(
    kind="kubernetes",
    shapes=(
        Shape(
            rf"/kubepods\.slice/(?:kubepods-(?:besteffort|burstable)\.slice/)?kubepods{_QOS}"
            rf"-pod(?P<pod>{_POD})\.slice(?:/{_RT}-(?P<id>{HEX64})\.scope)?{NEST}"
        ),
        Shape(
            rf"/kubelet\.slice/kubelet-kubepods\.slice/(?:kubelet-kubepods-(?:besteffort|"
            rf"burstable)\.slice/)?kubelet-kubepods{_QOS}-pod(?P<pod>{_POD})\.slice"
            rf"(?:/{_RT}-(?P<id>{HEX64})\.scope)?{NEST}"
        ),
        Shape(
            rf"{ROOT_SLICES}(?:containerd\.service/)?kubepods{_QOS}-pod(?P<pod>{_POD})\.slice"
            rf":{_RT}:(?P<id>{HEX64}){NEST}"
        ),
        Shape(
            rf"(?:/kubelet)?/kubepods/(?:(?P<qos>besteffort|burstable)/)?pod(?P<pod>{_POD})"
            rf"(?:/(?P<id>{HEX64}))?{NEST}"
        ),
    ),
    daemons=(
        r"containerd\.service",
        r"crio\.service",
        r"cri-o\.service",
        r"cri-dockerd?\.service",
        r"kubelet\.service",
        r"k3s(?:-agent)?\.service",
        r"rke2-(?:server|agent)\.service",
        r"snap\.microk8s\.daemon-(?:containerd|kubelite)\.service",
    ),
    build=_build,
    describe=_describe,
    owner=container_owner,
    restarts=always,  # the kubelet restarts a pod's containers
    lookup=Lookup(
        tool="crictl",
        ids=HEX64_ID,
        argv=_crictl,
        parse=parse_crictl_inspect,
        target=_container_id,
        apply=_apply,
        contradicts=_contradicts,
        sudo="crictl inspect *",
    ),
    nests=True,
    host_id=_container_id,
)
