"""gpubot: chat-ops for shared multi-GPU Linux boxes."""

__version__ = "0.1.0"
