"""GRPO, ARPO and the RFT control, one idea per file: the objectives as values (:mod:`.objectives`), the
group sampler with ARPO's branching (:mod:`.branching`), group advantages (:mod:`.advantages`), token
log-probs (:mod:`.logprobs`), the clipped token-mean loss (:mod:`.loss`) and supervised samples (:mod:`.sft`)."""

from agents.algorithms.advantages import Lineage, group_advantages, hard_token_advantages, soft_token_advantages
from agents.algorithms.branching import Group, sample_groups
from agents.algorithms.objectives import ARPO, GRPO, RFT, Algorithm, RunningScale

__all__ = ["ARPO", "GRPO", "RFT", "Algorithm", "Group", "Lineage", "RunningScale", "group_advantages",
           "hard_token_advantages", "sample_groups", "soft_token_advantages"]
