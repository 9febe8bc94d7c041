"""Claims and the queue: the commands, the pure decisions, and the store they need."""
