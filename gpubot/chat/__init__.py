"""What every front end shares: the /gpu command flows and the messages they render (no Slack
library and no store here)."""
