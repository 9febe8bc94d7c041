"""The packages admins run: each checked by a tool made for it.

- ``deploy/gpubot.service``: ``systemd-analyze verify`` (no warning) and ``systemd-analyze
  security --offline`` (exposure at most 2.0 of 10);
- ``deploy/k8s/*.yaml``: ``kubernetes-validate`` against the Kubernetes schemas it ships
  (offline), strict; the ConfigMap's settings load through gpubot's own loader;
- ``deploy/grafana-dashboard.json``: what ``deploy/dashboard.py`` (grafanalib) prints, and every
  series a query names is one that ``gpubot/metrics.py`` exports;
- ``docker-compose.yml``: the container's user can read the SSH key installed as it says.

Each has a control: the same tool refusing a broken copy.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError
from prometheus_client.parser import text_string_to_metric_families

from gpubot.cli import EXIT_ERROR
from gpubot.config import parse
from gpubot.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "gpubot.service"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # an older cluster still supported, and the newest
# What the control leaves out of the unit: it must then score worse than the threshold.
WEAKENED = (
    "ProtectSystem",
    "ProtectHome",
    "NoNewPrivileges",
    "SystemCallFilter",
    "CapabilityBoundingSet",
    "PrivateDevices",
    "RestrictAddressFamilies",
)
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
# The deployed metrics port: outside Prometheus's exporter range 9100-9999, which is allocated
# (9400 is dcgm-exporter's, on the same GPU hosts), and none of the common ones below.
METRICS_PORT = 8463
COMMON_PORTS = {3000, 8000, 8080, 8428, 8429, 9090, 9091, 9092, 9093, 9094}


# --- systemd ----------------------------------------------------------------------------------


def unit_copy(tmp_path: Path, text: str | None = None, name: str = "gpubot.service") -> Path:
    """Copy the unit with its gpubot executable pointed at a stub (verify checks it exists)."""
    stub = tmp_path / "bin" / "gpubot"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit = tmp_path / name
    body = UNIT.read_text() if text is None else text
    assert "/opt/gpubot/bin/gpubot " in body
    unit.write_text(body.replace("/opt/gpubot/bin/gpubot", str(stub)))
    return unit


def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert os.access(SYSTEMD_ANALYZE, os.X_OK), "systemd-analyze is needed; .ci/run installs it"
    return subprocess.run(
        [SYSTEMD_ANALYZE, *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_the_systemd_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    p = analyze("verify", unit_copy(tmp_path))
    assert (p.returncode, p.stderr) == (0, ""), p.stderr


def test_control_verify_reports_a_misspelt_directive(tmp_path: Path) -> None:
    text = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict")
    p = analyze("verify", unit_copy(tmp_path, text))
    assert "Unknown key 'ProtectSytem'" in p.stderr


def directives(text: str, key: str) -> list[str]:
    return [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{key}=")]


def test_the_unit_does_not_restart_on_a_refusal_to_start(tmp_path: Path) -> None:
    """A missing token exits EXIT_ERROR (``test_serve_ports.py``): restarting every 5 s would
    not fix it, so the unit names that status (and verify, above, accepts the directive)."""
    text = UNIT.read_text()
    assert directives(text, "Restart") == ["on-failure"]
    assert directives(text, "RestartPreventExitStatus") == [str(EXIT_ERROR)]
    p = analyze("verify", unit_copy(tmp_path))
    assert (p.returncode, p.stderr) == (0, ""), p.stderr


def test_control_verify_refuses_a_bad_exit_status(tmp_path: Path) -> None:
    text = UNIT.read_text().replace("RestartPreventExitStatus=2", "RestartPreventExitStatus=two")
    p = analyze("verify", unit_copy(tmp_path, text))
    assert "Failed to parse value, ignoring: two" in p.stderr, p.stderr


def test_every_deployment_serves_metrics_on_one_port_that_coexists() -> None:
    """The unit, compose and the manifests agree, on a port no neighbour on a GPU host takes."""
    assert not 9100 <= METRICS_PORT <= 9999 and METRICS_PORT not in COMMON_PORTS
    (start,) = directives(UNIT.read_text(), "ExecStart")
    assert f"--metrics-port {METRICS_PORT}" in start
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"--metrics-port {METRICS_PORT} " in compose
    assert f'"127.0.0.1:{METRICS_PORT}:{METRICS_PORT}"' in compose
    assert f"127.0.0.1:{METRICS_PORT}/metrics" in compose
    (service,) = by_kind()["Service"]
    assert [p["port"] for p in service["spec"]["ports"]] == [METRICS_PORT]
    everywhere = [ROOT / "README.md", ROOT / "gpubot.example.toml", *DEPLOY.rglob("*")]
    old = re.compile(r"(port[ =:]+|:)9400\b", re.I)  # as a port; comments may say why not
    # dcgm-exporter's own port, where a line names it (the relabelling snippet's targets)
    ours = [ln for p in everywhere if p.is_file() for ln in p.read_text().splitlines()]
    assert [ln for ln in ours if old.search(ln) and "dcgm-exporter" not in ln] == []


def test_the_systemd_unit_is_hardened(tmp_path: Path) -> None:
    text = UNIT.read_text()
    for line in (
        "User=gpubot",
        "ProtectSystem=strict",
        "StateDirectory=gpubot",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
        "CapabilityBoundingSet=",
    ):
        assert f"\n{line}\n" in text, line
    p = analyze("security", "--offline=yes", "--threshold=20", unit_copy(tmp_path))
    assert p.returncode == 0, p.stdout[-2000:]
    score = re.search(r"Overall exposure level for gpubot.service: ([0-9.]+)", p.stdout)
    assert score and float(score[1]) <= 2.0, p.stdout[-300:]


def test_control_a_weakened_unit_fails_the_security_threshold(tmp_path: Path) -> None:
    lines = UNIT.read_text().splitlines()
    keep = [ln for ln in lines if not ln.startswith(WEAKENED)]
    p = analyze("security", "--offline=yes", "--threshold=20", unit_copy(tmp_path, "\n".join(keep)))
    assert p.returncode != 0


def test_the_sysusers_file_creates_the_units_user(tmp_path: Path) -> None:
    """``systemd-sysusers`` itself, into a scratch root: the account User= names."""
    tool = shutil.which("systemd-sysusers") or "/usr/bin/systemd-sysusers"
    (tmp_path / "etc").mkdir()
    p = subprocess.run(
        [tool, f"--root={tmp_path}", str(DEPLOY / "gpubot.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    (entry,) = (tmp_path / "etc" / "passwd").read_text().splitlines()
    name, _, uid, _, _, home, shell = entry.split(":")
    assert (name, home, shell) == ("gpubot", "/var/lib/gpubot", "/usr/sbin/nologin")
    assert 0 < int(uid) < 1000  # a system account
    assert "\nUser=gpubot\n" in UNIT.read_text() and "\nStateDirectory=gpubot\n" in UNIT.read_text()


# --- Kubernetes -------------------------------------------------------------------------------


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path.name, doc


def by_kind() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for _, doc in manifests():
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_manifests_match_the_kubernetes_schemas(version: str) -> None:
    docs = list(manifests())
    assert {d["kind"] for _, d in docs} == {"ConfigMap", "Deployment", "Secret", "Service"}
    for name, doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises naming the field
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "gpubot", name


def test_control_a_misspelt_field_is_refused() -> None:
    (deployment,) = by_kind()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    template = {**deployment["spec"]["template"], "spec": {**pod, "securityContex": {}}}
    broken = {**deployment, "spec": {**deployment["spec"], "template": template}}
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_manifests_fit_together_and_the_settings_load() -> None:
    kinds = by_kind()
    (config,) = kinds["ConfigMap"]
    settings = parse(tomllib.loads(config["data"]["gpubot.toml"]), "configmap")
    assert settings.metrics.port == METRICS_PORT and settings.metrics.host == "0.0.0.0"
    assert settings.ssh.known_hosts == "/etc/gpubot/ssh/known_hosts"
    (deployment,) = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (bot,) = pod["containers"]
    assert pod["securityContext"]["runAsUser"] == image_uid() == pod["securityContext"]["fsGroup"]
    assert bot["securityContext"]["readOnlyRootFilesystem"] is True
    (ssh,) = [v for v in pod["volumes"] if v["name"] == "ssh"]
    assert ssh["secret"]["defaultMode"] == 0o440  # group-readable: the pod's fsGroup
    secrets = {s["metadata"]["name"]: s for s in kinds["Secret"]}
    assert set(secrets[ssh["secret"]["secretName"]]["stringData"]) == {
        "gpubot_ed25519",
        "known_hosts",
    }
    assert bot["envFrom"][0]["secretRef"]["name"] in secrets
    (service,) = kinds["Service"]
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in bot["ports"]} and port["name"] == "metrics"
    assert {p["containerPort"] for p in bot["ports"]} == {settings.metrics.port}


# --- Grafana ----------------------------------------------------------------------------------


def dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpubot_dashboard", DEPLOY / "dashboard.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exported_series() -> set[str]:
    """Every series name a scrape of gpubot can hold (``_total``, ``_bucket``, …)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    out: set[str] = set()
    for fam in text_string_to_metric_families(Metrics().text()):
        out |= {fam.name + s for s in suffixes.get(fam.type, ("",))}
    return out


def used_series(text: str) -> set[str]:
    return set(re.findall(r"\bgpubot_[a-z_]+\b", text))


def test_the_checked_in_dashboard_is_what_the_generator_prints() -> None:
    checked_in = (DEPLOY / "grafana-dashboard.json").read_text()
    assert checked_in == dashboard_module().render(), "run: python deploy/dashboard.py > …json"


def test_the_dashboard_uses_only_series_gpubot_exports() -> None:
    used = used_series((DEPLOY / "grafana-dashboard.json").read_text())
    exported = exported_series()
    assert len(used) >= 8 and used <= exported, sorted(used - exported)
    control = used_series("rate(gpubot_resets[5m]) + gpubot_gpu_memory_free_bytes")
    assert control - exported == {"gpubot_resets", "gpubot_gpu_memory_free_bytes"}


# --- docker compose ---------------------------------------------------------------------------


def image_uid() -> int:
    m = re.search(r"^ARG GPUBOT_UID=(\d+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert m, "the Dockerfile pins the gpubot user's uid"
    return int(m[1])


def compose_install_lines() -> list[str]:
    text = (ROOT / "docker-compose.yml").read_text()
    return [
        ln.removeprefix("#").strip() for ln in text.splitlines() if ln.startswith("#   install ")
    ]


def test_compose_runs_as_the_image_user() -> None:
    uid = image_uid()
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["gpubot"]["user"] == f"{uid}:{uid}"
    lines = compose_install_lines()
    assert len(lines) == 3 and all(f"-o {uid} -g {uid}" in ln for ln in lines)


def readable_as(uid: int, path: Path) -> bool:
    p = subprocess.run(
        ["cat", str(path)], user=uid, group=uid, capture_output=True, check=False, timeout=30
    )
    return p.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="installs files for another uid: needs root")
def test_the_key_installed_as_compose_says_is_readable_by_the_container_user() -> None:
    uid = image_uid()
    # Not under pytest's tmp_path: its parents are 0700, and the container user must get in.
    with tempfile.TemporaryDirectory() as folder:
        top = Path(folder)
        top.chmod(0o755)
        src = top / "etc"
        src.mkdir()
        for name in ("gpubot_ed25519", "known_hosts"):
            (src / name).write_text(f"{name}\n")
        (src / "gpubot_ed25519").chmod(0o600)  # as ssh-keygen writes it, owned by root
        work = top / "compose"
        work.mkdir()
        for line in compose_install_lines():
            cmd = line.replace("/etc/gpubot/ssh/", f"{src}/")
            subprocess.run(["sh", "-c", cmd], cwd=work, check=True, timeout=30)
        assert readable_as(uid, work / "ssh" / "gpubot_ed25519")
        assert readable_as(uid, work / "ssh" / "known_hosts")
        # Control: the README's old `cp` keeps root's 0600 key, which that user cannot read.
        old = top / "old"
        old.mkdir(mode=0o755)
        shutil.copy(src / "gpubot_ed25519", old / "gpubot_ed25519")
        assert not readable_as(uid, old / "gpubot_ed25519")
