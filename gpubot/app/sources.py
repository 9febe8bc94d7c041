"""The sources the root builds beside the transport: the cluster's slurmrestd, where the
settings name one. Its JWT is read here, once, from the environment variable the settings name
(``[slurm] restd_token_env``); an unset variable still builds the client, whose every call then
fails saying so (the doctor reports it, reads fall back to SSH)."""

from __future__ import annotations

from collections.abc import Mapping

from gpubot.config import Settings
from gpubot.core.ports import PromSource, SlurmRest
from gpubot.services.slurm_read import RestdReader


def slurm_rest(settings: Settings, environ: Mapping[str, str]) -> SlurmRest | None:
    """Return the client of ``[slurm] restd_url``; None when the settings name none."""
    s = settings.slurm
    if s.restd_url is None or s.restd_user is None:
        return None
    from gpubot.sources.slurmrestd import RestdClient  # aiohttp only where it is used

    token = environ.get(s.restd_token_env, "").strip() or None
    return RestdClient(
        s.restd_url, s.restd_user, token, timeout_s=s.timeout_s, token_env=s.restd_token_env
    )


def restd_reader(api: SlurmRest | None) -> RestdReader | None:
    return None if api is None else RestdReader(api)


def prom_source(settings: Settings, environ: Mapping[str, str]) -> PromSource | None:
    """Return the client of ``[prometheus] url``; None when the settings name none. Its bearer
    token is read here, once, from ``[prometheus] token_env`` (unset: no Authorization)."""
    p = settings.prometheus
    if p.url is None:
        return None
    from gpubot.sources.prometheus import PromClient  # aiohttp only where it is used

    return PromClient(p, environ.get(p.token_env, "").strip() or None)
