"""The console front end: ``/gpu …`` lines typed on a terminal, answered as text. Like
``gpubot.slack`` it is given narrow parts (``repl.ConsoleParts``), never the ``App``.
"""
