"""Harnesses: an OpenAI-compatible endpoint over the policy being trained, the agent loops trained
through it, what it records, and the trainer adapters (TRL)."""
