"""The doctor service over a stand-in transport: each node fails alone, with its own reason."""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.config import Settings
from gpubot.core.doctor.checks import Check
from gpubot.core.doctor.facts import DbFacts
from gpubot.core.models import CommandResult, NodeConfig
from gpubot.errors import AuthRefused, CommandTimeout, HostKeyRejected, NodeUnreachable
from gpubot.services.doctor import DoctorParts, DoctorService
from gpubot.slack.doctor_checks import SlackFacts, needed_scopes, slack_checks
from tests.fixtures.node_samples import answer

NODES = tuple(NodeConfig(name=f"n{i}", host=f"10.0.0.{i}") for i in range(1, 6))
ERRORS = {
    "n1": None,
    "n2": NodeUnreachable("n2", "cannot connect to 10.0.0.2:22: Connection refused"),
    "n3": HostKeyRejected("n3", "host key of 10.0.0.3:22 CHANGED: it does not match kh"),
    "n4": AuthRefused("n4", "10.0.0.4:22 refused our key for gpubot"),
    "n5": CommandTimeout("n5", "gpubot-doctor: no answer in 20s (abandoned)"),
}


class Transport:
    """Answers the doctor script with a healthy node's answer, or raises the node's error."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        self.asked.append(node.name)
        error = ERRORS[node.name]
        if error is not None:
            raise error
        return CommandResult(tuple(argv), 0, answer(), "")

    async def close(self) -> None:
        pass


async def fingerprint(node: NodeConfig) -> str | None:
    return f"ssh-ed25519 SHA256:fake-{node.name}"


async def slack(settings: Settings) -> list[Check]:
    facts = SlackFacts(team="T", user="gpubot", scopes=frozenset({"commands"}))
    return slack_checks(facts, needed_scopes(settings.policy, idle_dm=False))


def database() -> DbFacts:
    return DbFacts("sqlite://", revision="0005", head="0005")


async def checks() -> dict[str, dict[str, Check]]:
    settings = Settings(nodes=NODES)
    service = DoctorService(settings, Transport(), DoctorParts(fingerprint, slack, database))
    out: dict[str, dict[str, Check]] = {}
    for c in await service.check(NODES):
        out.setdefault(c.area, {})[c.name] = c
    return out


async def test_each_node_fails_alone_with_its_reason() -> None:
    by = await checks()
    assert all(c.ok for c in by["n1"].values())
    assert not by["n2"]["reachable"].ok and "Connection refused" in by["n2"]["reachable"].detail
    assert by["n3"]["reachable"].ok and not by["n3"]["host key"].ok
    assert "SHA256:fake-n3" in by["n3"]["host key"].detail
    assert "ssh-keygen -R '[10.0.0.3]:22'" in by["n3"]["host key"].fix
    assert by["n4"]["host key"].ok and not by["n4"]["auth"].ok
    assert "authorized_keys" in by["n4"]["auth"].fix
    assert not by["n5"]["reachable"].ok


async def test_slack_and_the_database_are_checked_beside_the_nodes() -> None:
    by = await checks()
    assert not by["slack"]["scopes"].ok and "users:read" in by["slack"]["scopes"].fix
    assert all(c.ok for c in by["database"].values())


async def test_a_local_node_claims_no_ssh_checks() -> None:
    local = NodeConfig(name="here", host="local")
    ERRORS["here"] = None
    try:
        service = DoctorService(Settings(nodes=(local,)), Transport(), DoctorParts(fingerprint))
        names = [c.name for c in await service.node(local)]
    finally:
        del ERRORS["here"]
    assert names[0] == "reachable" and "host key" not in names and "auth" not in names
