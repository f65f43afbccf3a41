"""The ecosystems' APIs over the engine: each face is a view of an :class:`~envfactory.Episode`.

* :mod:`.gym_env`: Gymnasium (``gymnasium.make("envfactory/<Name>-v<N>")``);
* :mod:`.pettingzoo_env`: PettingZoo AEC and Parallel views of team environments
  (``pettingzoo_env.env(name)``, ``pettingzoo_env.parallel_env(name)``);
* :mod:`.mcp_server`: ``envfactory serve NAME --protocol mcp`` (the official MCP SDK);
* :mod:`.openenv_server`: ``envfactory serve NAME --protocol openenv`` (openenv-core).

Every face draws tasks from one split (default ``train``: the sft and rl tasks); evaluation
tasks are drawn only where ``split="eval"`` (or ``"all"``) is asked for.
"""
