"""Tasks: where arguments come from, synthesis by walking the tool graph, the goal-level kinds and
their grammar, the language layer (realize, words, paraphrase), users' goals, and success checks."""
