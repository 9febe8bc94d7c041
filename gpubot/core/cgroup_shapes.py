"""The cgroup paths that name a workload, one table: ``core.workload`` reads it.

Every pattern is matched over a whole path from the root of the hierarchy (see
``core.workload``: a user can create cgroups only inside their own delegated subtree, and a
container's root only inside its container's cgroup). The first pattern that matches wins.
A ``tail`` group marks a container's own subtree, where a container's root may nest another
container (docker-in-docker, a kind node's pods); a ``reason_*`` group marks a known shape that
is no workload gpubot may name, advise or stop.

Sources, each shape with the public text that shows it (the real samples are in tests/corpus/):

- Docker (docs.docker.com, ``native.cgroupdriver``): ``/system.slice/docker-ID.scope``
  (systemd), ``/docker/ID`` (cgroupfs); docker-in-docker ``/docker/OUTER/docker/INNER``.
- Podman (podman(1) ``--cgroup-manager``): ``/machine.slice/libpod-ID.scope``,
  ``/libpod_parent/libpod-ID``; rootless under ``user@UID.service``.
- The kubelet (kubernetes.io "cgroup drivers"): ``/kubepods.slice/kubepods-QOS.slice/
  kubepods-QOS-podUID.slice/cri-containerd-ID.scope`` (systemd), ``/kubepods/QOS/podUID/ID``
  (cgroupfs); kind's ``--cgroup-root=/kubelet`` (``/kubelet.slice/kubelet-kubepods.slice/...``,
  ``/kubelet/kubepods/...``). A static pod's UID is 32 hex digits (the manifest's hash).
- containerd with ``SystemdCgroup = false`` under a kubelet using the systemd driver: the CRI
  plugin writes the cgroupsPath as ``slice:cri-containerd:ID`` (containerd/cri PR #290) and runc's
  cgroupfs manager takes it as a path below containerd's own cgroup:
  ``/system.slice/containerd.service/kubepods-QOS-podUID.slice:cri-containerd:ID``
  (containerd issue #5226, DataDog agent and OpenTelemetry test fixtures).
- Slurm (slurm.conf/cgroup.conf, ``src/plugins/cgroup/v1/xcgroup.c``): v1
  ``/slurm/uid_U/job_J/step_S``, or ``/slurm_NODE/...`` under ``MULTIPLE_SLURMD`` (Debian's and
  Spack's builds); v2 ``/system.slice/NODE_slurmstepd.scope/job_J/step_S``, and from Slurm
  26.05 ``.../slurmstepd.scope/SLUID/step_S`` (doc/html/cgroups.shtml).
- LXC/LXD (lxc.container.conf(5) ``lxc.cgroup.dir``; LXC 4.0 release notes): ``/lxc.payload.NAME``
  and ``/lxc.monitor.NAME`` (LXC 4+ and LXD), ``/lxc/NAME`` (LXC 3 and older).
- Apptainer/Singularity ``--apply-cgroups`` (apptainer PR #336): ``singularity-PID.scope`` in
  ``system.slice`` or ``/singularity/PID``: named by a PID, so no stable container id: ``other``.
- systemd.special(7): ``system.slice``, ``user.slice``, ``machine.slice``; a runtime's or
  scheduler's own unit (``containerd.service``, ``slurmstepd.scope`` ...) holds only its daemons.
"""

from __future__ import annotations

import re

_HEX64 = r"[0-9a-f]{64}"
# A pod UID: 36 characters (the systemd driver writes its dashes as underscores), or 32 hex
# digits without dashes (a static pod's UID is a hash of its manifest: CRI-O's and kubeadm's).
_POD = r"(?:[0-9a-f_-]{36}|[0-9a-f]{32})"
_TAIL = r"(?:/.*)?"  # cgroups a workload made inside its own (a container's init.scope ...)
_NEST = r"(?P<tail>/.*)?"  # the same, where a container's root may have nested another one
_LXC_NAME = r"(?P<id>[A-Za-z0-9][A-Za-z0-9_.+-]{0,63})"
# Slurm 26.05+ names a job's v2 cgroup by its SLUID ("s" and 13 Crockford base32 digits,
# src/common/sluid.h; commit de2b2dd9 "cgroup/v2 - Use sluid instead of job_id in cgroup path").
SLUID = r"s[0-9A-HJKMNP-TV-Z]{13}"
_QOS = r"(?:-(?P<qos>besteffort|burstable))?"
_K8S_RT = r"(?P<rt>cri-containerd|crio|docker)"

# The units of container runtimes and schedulers themselves: a process found there is a daemon
# or a shim (containerd-shim, conmon, slurmstepd), never a workload; stopping the unit would stop
# every container or job on the node.
_DAEMON = (
    r"containerd|docker|crio|cri-o|cri-dockerd?|kubelet|podman|k3s(?:-agent)?|rke2-(?:server|agent)"
    r"|snap\.docker\.dockerd|snap\.lxd\.daemon|snap\.microk8s\.daemon-(?:containerd|kubelite)"
    r"|lxd|lxc|slurmd|slurmctld|slurmdbd"
)
_LOGIN = r"ssh|sshd|openssh-server|cron|crond|cronie|anacron|atd|xrdp|xrdp-sesman"
_ROOT_SLICES = r"/(?:(?!user\.slice/)[^/]+\.slice/)*"  # slices only root can make

# (kind, pattern over the whole path); the first that matches wins. ``reason`` names a shape
# that is known but is no workload gpubot may name, advise or stop.
SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern + r"\Z"))
    for kind, pattern in (
        # The kubelet's systemd driver; kind's nodes use --cgroup-root=/kubelet.
        (
            "kubernetes",
            rf"/kubepods\.slice/(?:kubepods-(?:besteffort|burstable)\.slice/)?kubepods{_QOS}"
            rf"-pod(?P<pod>{_POD})\.slice(?:/{_K8S_RT}-(?P<id>{_HEX64})\.scope)?{_NEST}",
        ),
        (
            "kubernetes",
            rf"/kubelet\.slice/kubelet-kubepods\.slice/(?:kubelet-kubepods-(?:besteffort|burstable)"
            rf"\.slice/)?kubelet-kubepods{_QOS}-pod(?P<pod>{_POD})\.slice"
            rf"(?:/{_K8S_RT}-(?P<id>{_HEX64})\.scope)?{_NEST}",
        ),
        # containerd with SystemdCgroup=false under a kubelet using the systemd driver: runc
        # takes the "slice:prefix:id" cgroupsPath as a path below containerd's own cgroup.
        (
            "kubernetes",
            rf"{_ROOT_SLICES}(?:containerd\.service/)?kubepods{_QOS}-pod(?P<pod>{_POD})\.slice"
            rf":{_K8S_RT}:(?P<id>{_HEX64}){_NEST}",
        ),
        (
            "kubernetes",
            rf"(?:/kubelet)?/kubepods/(?:(?P<qos>besteffort|burstable)/)?pod(?P<pod>{_POD})"
            rf"(?:/(?P<id>{_HEX64}))?{_NEST}",
        ),
        ("docker", rf"/system\.slice/docker-(?P<id>{_HEX64})\.scope{_NEST}"),
        ("docker", rf"/docker/(?P<id>{_HEX64}){_NEST}"),
        ("podman", rf"/(?:machine|system)\.slice/libpod-(?P<id>{_HEX64})\.scope{_NEST}"),
        ("podman", rf"/libpod_parent/libpod-(?P<id>{_HEX64}){_NEST}"),
        (
            "slurm",
            r"/slurm(?:_[A-Za-z0-9._-]+)?/uid_(?P<uid>\d+)/job_(?P<job>\d+)"
            r"(?:/step_(?P<step>[a-z0-9]+))?" + _TAIL,
        ),
        (
            "slurm",
            r"/system\.slice/(?:[^/]+_)?slurmstepd\.scope/(?:job_(?P<job>\d+)|(?P<sluid>"
            + SLUID
            + r"))(?:/step_(?P<step>[a-z0-9]+))?"
            + _TAIL,
        ),
        # LXC 4+ and LXD (lxc.payload.NAME, lxc.monitor.NAME), LXC 3 and older (/lxc/NAME).
        ("lxc", rf"/lxc\.payload[./]{_LXC_NAME}{_NEST}"),
        ("lxc", rf"/lxc/{_LXC_NAME}{_NEST}"),
        ("other", r"/lxc\.monitor[./](?P<reason_lxc_monitor>[^/]+)" + _TAIL),
        # Rootless containers: inside the user's own subtree, so the user's, whatever they say.
        (
            "podman",
            rf"/user\.slice/user-(?P<uid>\d+)\.slice/user@\d+\.service/(?:[^/]+/)*"
            rf"libpod-(?P<id>{_HEX64})\.scope{_NEST}",
        ),
        (
            "docker",
            rf"/user\.slice/user-(?P<uid>\d+)\.slice/user@\d+\.service/(?:[^/]+/)*"
            rf"docker-(?P<id>{_HEX64})\.scope{_NEST}",
        ),
        (
            "session",
            r"/user\.slice/user-(?P<uid>\d+)\.slice/(?P<unit>session-[0-9a-z]+\.scope)" + _TAIL,
        ),
        ("session", r"/user\.slice/user-(?P<uid>\d+)\.slice/(?P<unit>user@\d+\.service)" + _TAIL),
        (
            "other",
            rf"{_ROOT_SLICES}(?P<reason_daemon>(?:{_DAEMON})\.service|(?:[^/]+_)?slurmstepd\.scope)"
            + _TAIL,
        ),
        # Without pam_systemd, every login or cron job stays in the unit of the daemon that
        # started it: stopping that unit would end sshd or cron (and everyone's sessions).
        (
            "other",
            rf"{_ROOT_SLICES}(?P<reason_login>(?:{_LOGIN})\.service|(?:serial-)?getty@[^/]+\.service)"
            + _TAIL,
        ),
        # Apptainer/Singularity --apply-cgroups: a scope or folder named by the starter's PID.
        (
            "other",
            r"(?:/system\.slice/(?P<reason_apptainer>(?:apptainer|singularity)(?:-oci)?-[^/]+\.scope)"
            r"|/(?P<reason_apptainer_fs>apptainer|singularity)/\d+)" + _TAIL,
        ),
        (
            "service",
            r"/system\.slice/(?:[^/]+\.slice/)*(?P<unit>[A-Za-z0-9:_.@\\-]+\.service)" + _TAIL,
        ),
    )
)

REASONS = {
    "reason_daemon": "runtime daemon's own unit",
    "reason_login": "a login or cron daemon's own unit: it holds other users' sessions too",
    "reason_lxc_monitor": "LXC's monitor of a container, not the container",
    "reason_apptainer": "Apptainer cgroup named by its starter's PID: no stable container id",
    "reason_apptainer_fs": "Apptainer cgroup named by its starter's PID: no stable container id",
}
MAX_NEST = 4  # levels of containers in containers read; deeper ones name the level reached
