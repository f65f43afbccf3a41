"""Checks that an environment is what it claims: :mod:`.verify` (the verification suite behind
``envfactory verify``), :mod:`.audit` (the reward-hacking search) and :mod:`.scripted` (the
scripted agents both use: reference, no-op, random, claim, transcriber)."""
