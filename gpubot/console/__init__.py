"""The console front end: ``/gpu …`` lines typed on a terminal, the neutral messages printed as
text (``text_render``), the start-up report printed (``report``), the loop (``repl``).

Like ``gpubot.slack`` it is given narrow parts (``repl.ConsoleParts``), never the ``App``;
``gpubot.cli.console`` (the entry) builds them.
"""
