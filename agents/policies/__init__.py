"""Policies: the model backends (HF transformers, vLLM, OpenAI-compatible HTTP, a worker process),
how a policy is named and loaded, chat rendering, and LLMs in other roles (simulated users, judges)."""
