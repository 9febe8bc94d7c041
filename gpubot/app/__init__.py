"""The composition root (``root``): settings → stores → services → duties, each built once and
complete, in dependency order (``stores``, ``services``, ``duties``). A chat front end is passed
in by the entry that chose it (``front.FrontEnd``); the root imports none. Front ends receive
narrow parts of the ``App``, never the ``App`` itself."""

from gpubot.app.front import FrontEnd as FrontEnd
from gpubot.app.front import Publisher as Publisher
from gpubot.app.root import App as App
from gpubot.app.root import build as build
from gpubot.app.root import doctor_service as doctor_service
from gpubot.app.root import settings_from as settings_from
from gpubot.app.stores import open_app_store as open_app_store
from gpubot.lifecycle import Running as Running
from gpubot.lifecycle import Serving as Serving
