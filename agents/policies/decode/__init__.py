"""Decode internals of the HF backend: the shared-prefix cache, batched attention over it, and the
lean decode loop."""
