"""The Matrix front end: ``!gpu …`` messages in the rooms the settings allow (and DMs with the
bot), answered as ``m.notice`` events with HTML and a plain-text fallback, over the client-server
API with aiohttp. Like ``gpubot.slack`` it is given narrow parts (``bot.MatrixParts``), never
the ``App``.
"""
