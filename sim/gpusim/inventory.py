"""What a simulated fleet gives gpubot: SSH keys, a known_hosts file and a ``gpubot.toml``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpusim.node import SimNode
from gpusim.sshlib import asyncssh

RUNTIMES = ("docker", "podman", "slurm", "crictl")  # what the inventory lists (gpubot.config)


def write_keys(root: Path, client_key: Path, nodes: int) -> None:
    """Write the client key (and ``authorized_keys``) and a host key per node directory."""
    client = asyncssh.generate_private_key("ssh-ed25519", comment=f"gpusim@{root}")
    client.write_private_key(str(client_key))
    client.write_public_key(str(client_key) + ".pub")
    os.chmod(client_key, 0o600)
    (root / "authorized_keys").write_bytes(client.export_public_key())
    for i in range(nodes):
        d = root / f"node{i + 1}"
        d.mkdir(parents=True, exist_ok=True)
        host = asyncssh.generate_private_key("ssh-ed25519", comment=f"node{i + 1}")
        host.write_private_key(str(d / "ssh_host_ed25519_key"))
        host.write_public_key(str(d / "ssh_host_ed25519_key.pub"))
        os.chmod(d / "ssh_host_ed25519_key", 0o600)


def write_known_hosts(path: Path, nodes: Sequence[SimNode]) -> None:
    """Pin each node's host key at ``[127.0.0.1]:PORT``."""
    lines = []
    for n in nodes:
        pub = (n.dir / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"[127.0.0.1]:{n.port} {pub[0]} {pub[1]}\n")
    path.write_text("".join(lines))


def config_text(
    nodes: Sequence[SimNode],
    *,
    title: str,
    database_url: str,
    known_hosts: Path,
    user: str,
    client_key: Path,
    protected: Sequence[str] | None = None,
) -> str:
    """Return the ``gpubot.toml`` of ``nodes`` (``protected``: the ``[reset]`` list, if any)."""
    q = toml_str
    out = [
        f"# {title}",
        "# Written by gpusim; load it with gpubot --config (or $GPUBOT_CONFIG).",
        "",
        "[database]",
        f"url = {q(database_url)}",
        "",
        "[ssh]",
        f"known_hosts = {q(str(known_hosts))}",
        "",
    ]
    if protected is not None:
        out += ["[reset]", f"protected = [{', '.join(q(p) for p in protected)}]", ""]
    for n in nodes:
        parity = "odd" if (n.index + 1) % 2 else "even"
        out += [
            "[[nodes]]",
            f"name = {q(n.name)}",
            'host = "127.0.0.1"',
            f"port = {n.port}",
            f"user = {q(user)}",
            f"key = {q(str(client_key))}",
            f"dev_prefix = {q(n.dev_prefix)}",
            f"nvidia_smi = {q(n.nvidia_smi)}",
            f"driver_dir = {q(n.driver_dir)}",
            f"pci_dir = {q(n.pci_dir)}",
            f"fabricmanager_pid = {q(n.fabricmanager_pid)}",
            *(["sudo = true"] if n.sudo else []),
            *(
                [f"runtimes = [{', '.join(q(r) for r in n.runtime_names)}]"]
                if n.runtime_names
                else []
            ),
            f'groups = ["sim", "{parity}"]',
            "",
        ]
    return "\n".join(out)


def toml_str(s: str) -> str:
    """Quote ``s`` as a TOML basic string."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
