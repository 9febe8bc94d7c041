"""The reset engine's pure parts: the plan, the guarded signal and stop scripts, the outcome."""
