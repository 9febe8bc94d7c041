"""The composition root (``root``): settings → stores → services → duties, each built once and
complete, in dependency order (``stores``, ``services``, ``duties``). A chat front end is passed
in by the entry that chose it (``front.FrontEnd``); the root imports none. Front ends receive
narrow parts of the ``App``, never the ``App`` itself."""

from gpubot.app.front import FrontEnd, Publisher
from gpubot.app.root import App, build, doctor_service, settings_from
from gpubot.app.stores import open_app_store
from gpubot.lifecycle import Running, Serving

__all__ = [
    "App",
    "FrontEnd",
    "Publisher",
    "Running",
    "Serving",
    "build",
    "doctor_service",
    "open_app_store",
    "settings_from",
]
