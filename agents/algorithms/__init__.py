"""GRPO, ARPO and the RFT control behind one protocol: the branching sampler (:mod:`.arpo`), group advantages
(:mod:`.advantages`) and the clipped token-mean loss (:mod:`.loss`), one idea per file."""

from .advantages import Lineage, group_advantages, hard_token_advantages, soft_token_advantages
from .arpo import ARPO, GRPO, RFT, Algorithm, Group, sample_groups

__all__ = ["ARPO", "GRPO", "RFT", "Algorithm", "Group", "Lineage", "group_advantages", "hard_token_advantages",
           "sample_groups", "soft_token_advantages"]
