"""Reading Slurm through slurmrestd (issue 36): the version discovered from the recorded
``/openapi/v3`` documents (tests/corpus/slurm/, sources in its README.md), the answers that are
read or refused, and the ``[slurm]`` keys. The real slurmrestd is in
tests/integration/test_slurm_restd.py; here a stand-in of the ``SlurmRest`` port serves recorded
documents, so that versions this machine cannot run (v0.0.40+) are discovered too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load
from gpubot.core.slurm import parse, rest
from gpubot.errors import ConfigError, SlurmRestFailed
from gpubot.services.slurm_read import RestdReader

SLURM = Path(__file__).resolve().parent.parent / "corpus" / "slurm"


def corpus(name: str) -> Any:
    return json.loads((SLURM / name).read_text(encoding="utf-8"))


# What Debian's slurmrestd 22.05.8 answered here for a node it does not know (HTTP 500), as
# tests/fixtures/slurm.py's slurm_accounting serves it (meta left out).
V38_UNKNOWN_NODE = {
    "errors": [{"error": "Invalid node name specified", "errno": 2018}],
    "nodes": [],
}
# ... and for /jobs with a token it refused (HTTP 500).
V38_REFUSED_JOBS = {
    "errors": [
        {
            "description": "Failed while looking for jobs",
            "error_number": -1,
            "error": "Unspecified error",
            "source": "slurm_load_jobs",
        }
    ],
    "jobs": [],
}


class Served:
    """The ``SlurmRest`` port over a table of answers by path; it counts what is asked."""

    url = "http://slurmrestd.test"

    def __init__(self, answers: Mapping[str, tuple[int, Any]]) -> None:
        self.answers = dict(answers)
        self.asked: list[str] = []

    async def get(self, path: str) -> tuple[int, Any]:
        self.asked.append(path)
        return self.answers.get(path, (404, None))

    async def close(self) -> None:
        return None


def served_by(openapi: str, node: str = "gpu2") -> dict[str, tuple[int, Any]]:
    """A slurmrestd of the recorded description ``openapi`` serving node ``gpu2``'s answers
    (v0.0.44's recorded job 5557 on gpu2, a node with no reason) at every version."""
    versions = parse.openapi_versions(corpus(openapi))
    jobs = corpus("v0.0.44-job-gpus-running.json")
    nodes = {"nodes": [{"name": node, "state": ["IDLE"]}]}
    out: dict[str, tuple[int, Any]] = {"/openapi/v3": (200, corpus(openapi))}
    for v in versions:
        out[rest.jobs_path(v)] = (200, jobs)
        out[rest.node_path(v, node)] = (200, nodes)
    return out


@pytest.mark.parametrize(
    ("openapi", "picked"), [("openapi-24.11.json", "v0.0.42"), ("openapi-25.11.json", "v0.0.44")]
)
async def test_the_highest_version_read_is_picked_from_the_recorded_descriptions(
    openapi: str, picked: str
) -> None:
    api = Served(served_by(openapi))
    reader = RestdReader(api)
    said = await reader.read("gpu2")
    assert said.version == picked
    assert [(j.job_id, j.user, j.gpu_idx) for j in said.jobs] == [("5557", "jbeck", (0, 1, 2, 3))]
    assert said.node is not None and said.node.states == ("IDLE",)
    await reader.read("gpu2")
    assert api.asked.count("/openapi/v3") == 1 and reader.discoveries == 1  # discovered once


def test_22_05_serves_v0_0_38_highest_and_it_is_read() -> None:
    """Debian's 22.05 serves v0.0.36 to v0.0.38 (seen on the real one, integration tests)."""
    assert parse.pick_version(["v0.0.36", "v0.0.37", "v0.0.38"]) == "v0.0.38"
    assert parse.pick_version(["v0.0.36", "v0.0.37"]) is None


async def test_a_404_discovers_again_once_and_reads_the_new_version() -> None:
    """slurmrestd restarted with newer plugins: v0.0.42's paths answer 404 now."""
    api = Served(served_by("openapi-24.11.json"))
    reader = RestdReader(api)
    assert (await reader.read("gpu2")).version == "v0.0.42"
    api.answers.update(served_by("openapi-25.11.json"))
    for path in [p for p in api.answers if "/v0.0.42/" in p]:
        api.answers[path] = (404, None)
    assert (await reader.read("gpu2")).version == "v0.0.44"
    assert reader.discoveries == 2


async def test_a_slurmrestd_of_no_known_version_is_one_line() -> None:
    doc: dict[str, Any] = {"paths": {"/slurm/v0.0.36/jobs": {}, "/slurm/v0.0.37/jobs": {}}}
    reader = RestdReader(Served({"/openapi/v3": (200, doc)}))
    with pytest.raises(SlurmRestFailed, match=r"serves /slurm/ v0.0.36, v0.0.37; gpubot reads"):
        await reader.read("gpu2")


@pytest.mark.parametrize(
    ("status", "doc", "said"),
    [
        (401, None, r"jobs: HTTP 401 \(the token or the user was refused\)"),
        (500, V38_REFUSED_JOBS, "jobs: HTTP 500: Failed while looking for jobs"),
        (200, {"errors": [{"description": "slurmctld down"}], "jobs": []}, "slurmctld down"),
        (200, {"no": "jobs"}, "no 'jobs' list"),
    ],
)
async def test_a_jobs_answer_that_does_not_read_fails_never_no_jobs(
    status: int, doc: Any, said: str
) -> None:
    answers = served_by("openapi-25.11.json")
    answers[rest.jobs_path("v0.0.44")] = (status, doc)
    with pytest.raises(SlurmRestFailed, match=said):
        await RestdReader(Served(answers)).read("gpu2")


async def test_an_unknown_node_reads_as_unknown_not_as_a_failure() -> None:
    answers = served_by("openapi-25.11.json")
    unfound = corpus("v0.0.44-node-unfound.json")  # the recorded answer names this node
    answers[rest.node_path("v0.0.44", "unexisting-node")] = (200, unfound)
    said = await RestdReader(Served(answers)).read("unexisting-node")
    assert said.node is None and said.jobs == ()


@pytest.mark.parametrize(
    ("status", "doc", "readable"),
    [
        (500, V38_UNKNOWN_NODE, True),
        (
            500,
            {"errors": [{"error": "Invalid node name specified", "errno": 2017}], "nodes": []},
            False,
        ),
        (500, {**V38_UNKNOWN_NODE, "nodes": [{"name": "x"}]}, False),
        (500, V38_REFUSED_JOBS, False),  # an error without its node: not "unknown"
        (401, None, False),
        (200, {"nodes": []}, True),
    ],
)
def test_which_node_answers_are_read(status: int, doc: Any, readable: bool) -> None:
    assert rest.node_answer(status, doc, "node7") is readable


def test_a_node_name_cannot_leave_its_path() -> None:
    assert rest.node_path("v0.0.38", "a/../jobs") == "/slurm/v0.0.38/node/a%2F..%2Fjobs"


def write(tmp: Path, slurm: str) -> Path:
    path = tmp / "gpubot.toml"
    path.write_text(f'[[nodes]]\nname = "n1"\nhost = "local"\n\n[slurm]\n{slurm}\n')
    return path


def test_restd_keys_are_read(tmp_path: Path) -> None:
    text = 'restd_url = "http://head:6820/"\nrestd_user = "gpubot"\nrestd_token_env = "JWT_X"'
    s = load(write(tmp_path, text)).slurm
    assert (s.restd_url, s.restd_user, s.restd_token_env) == ("http://head:6820", "gpubot", "JWT_X")
    assert load(write(tmp_path, "")).slurm.restd_url is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('restd_url = "ftp://head"\nrestd_user = "g"', "slurm.restd_url: expected"),
        ('restd_url = "http://u:pw@head"\nrestd_user = "g"', "slurm.restd_url: expected"),
        ('restd_url = "http://head"', "slurm.restd_user: the Slurm user"),
        ('restd_user = "g"', "slurm.restd_user: set only with slurm.restd_url"),
        (
            'restd_url = "http://head"\nrestd_user = "g"\nrestd_token_env = "eyJhbGciOi.x.y"',
            "not an environment",
        ),
    ],
)
def test_bad_restd_keys_are_one_line(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as exc:
        load(write(tmp_path, text))
    assert "\n" not in str(exc.value)
