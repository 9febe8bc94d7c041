"""SSH trusts host keys through the configured known_hosts only: not the X.509 CA bundle
(``~/.ssh/ca-bundle.crt``) or certificate folder (``~/.ssh/crt``) asyncssh loads by default."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load
from gpubot.core.models import NodeConfig
from gpubot.transport import SshTransport
from gpubot.transport.sshlib import asyncssh
from gpusim.fleet import SimFleet

BUNDLE = "a CA bundle, here without a certificate: this venv's asyncssh cannot parse X.509\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.ssh holds what asyncssh would trust for X.509 by default."""
    ssh = tmp_path / "home" / ".ssh"
    (ssh / "crt").mkdir(parents=True)
    (ssh / "ca-bundle.crt").write_text(BUNDLE)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every certificate source asyncssh loads for X.509 trust, as it loads it."""
    calls: list[Any] = []
    real = vars(asyncssh.connection)["load_certificates"]  # not re-exported: internal

    def spy(certs: Any, *args: Any, **kw: Any) -> Any:
        calls.append(certs)
        return real(certs, *args, **kw)

    monkeypatch.setattr(asyncssh.connection, "load_certificates", spy)
    return calls


def test_asyncssh_would_trust_the_bundle_by_default(home: Path, loaded: list[Any]) -> None:
    # Options built only to show asyncssh's defaults; nothing connects with them, so no host key
    # is skipped (gpubot's own options, below, always carry its known_hosts).
    opts = asyncssh.SSHClientConnectionOptions(host="node1", config=None, known_hosts=None)
    assert loaded == [str(home / ".ssh" / "ca-bundle.crt")]
    assert opts.x509_trusted_certs is not None
    assert opts.x509_trusted_cert_paths == [str(home / ".ssh" / "crt")]


def test_gpubot_trusts_no_x509_from_home(home: Path, loaded: list[Any], tmp_path: Path) -> None:
    transport = SshTransport(load_settings_of_nothing(tmp_path).ssh)
    node = NodeConfig(name="node1", host="127.0.0.1", port=2222)
    opts = transport.client_options(node, asyncssh.import_known_hosts(""))
    made = asyncssh.SSHClientConnectionOptions(host="127.0.0.1", **opts)
    assert (made.x509_trusted_certs, made.x509_trusted_cert_paths) == (None, [])
    assert made.config is not None and loaded == []


def load_settings_of_nothing(tmp_path: Path) -> Any:
    cfg = tmp_path / "empty.toml"
    cfg.write_text("")
    return load(cfg)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("trust"), nodes=1, gpus=1) as f:
        yield f


async def test_a_connection_reads_nothing_x509_from_home(
    fleet: SimFleet, home: Path, loaded: list[Any]
) -> None:
    settings = load(fleet.config_path)
    transport = SshTransport(settings.ssh)
    try:
        result = await transport.run(settings.nodes[0], ["echo", "hello"])
    finally:
        await transport.close()
    assert (result.exit_status, result.stdout) == (0, "hello\n")
    # The bundle in ~/.ssh was never read (the simulated server, in this process, loads ()).
    assert str(home / ".ssh" / "ca-bundle.crt") not in loaded
