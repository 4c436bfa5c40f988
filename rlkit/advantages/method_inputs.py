"""The estimators of the methods that train on no group baseline: PPO's reward (``ppo``,
docs/algorithms.md §4c) and DPO's pair roles (``dpo``, §4d), each the per-row input its method
(``rlkit.methods.PPO``, ``rlkit.methods.DPO``) turns into its own training signal."""

from __future__ import annotations

from rlkit.advantages.base import AdvantageEstimator, register
from rlkit.dpo import pair_roles


@register("ppo")
class PPOReward(AdvantageEstimator):
    """PPO's per-row input: each completion's verifiable reward, no group baseline (the critic is
    the baseline); ``rlkit.methods.PPO`` puts it on the last token and GAE turns it into per-token
    advantages (docs/algorithms.md §4c). A group of one is fine."""

    min_group_size = 1

    def compute(self, rewards, cluster_ids):
        return rewards.clone(), {}


@register("dpo")
class DPOPairRoles(AdvantageEstimator):
    """DPO's per-row input: +1 for a chosen completion, −1 for a rejected one, 0 for one in no
    pair (``rlkit.dpo.pair_roles``); ``rlkit.methods.DPO`` trains on the pairs themselves with the
    preference loss (docs/algorithms.md §4d)."""

    def compute(self, rewards, cluster_ids):
        return pair_roles(rewards), {}
