"""What every front end shares: the /gpu command flows and the messages they render.

No Slack library and no store here: Slack, the console and the demo each adapt these.
"""
