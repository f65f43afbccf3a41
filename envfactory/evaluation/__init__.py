"""Evaluation of agents, alone or in teams: :mod:`.eval` (episode rows, success with Wilson
intervals, coordination metrics, cross-play), :mod:`.report` (the reports of ``envfactory eval``
and ``envfactory eval-team``) and :mod:`.rating` (ratings of players in competitive games)."""
