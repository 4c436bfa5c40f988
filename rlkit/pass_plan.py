"""Which of the step's passes (`rlkit.logprobs.PolicyForward`) a configuration runs, and what
they compute: :class:`PassPlan`, the one place that decides it (used by the trainer, the update,
`rlkit plan` and the benchmarks): the reference pass only with a KL term, π_old's pass only when
the update is off-policy, entropy when the method or the log asks for it, prompts shared where
the policy can share them; and :func:`inactive_clips`, the clip settings that cannot act."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import torch

from rlkit.config import TrainConfig
from rlkit.logprobs import PromptSharingError, prompt_sharing_refusal
from rlkit.models.loading import train_mode_changes_forward


@dataclass(frozen=True)
class PassPlan:
    """Which passes a configuration runs and what they compute; the one spelling of the rule.

    ``reference``: the reference pass (a KL term, or ``optim.skip_redundant_passes=false``).
    ``entropy``: π_old's pass computes entropy (the method needs it, e.g. AGPO's signals, or it
    is logged). ``clip_needs_entropy``: the clip radius depends on the pre-update entropy (AGPO's
    adaptive clip). ``step_kl``: the method reads the drift after the update (AGPO).
    ``values``: π_old's pass also gives the value head's V_old (PPO), so it always runs.
    ``old``: the loss reads π_old (not DPO's, whose pass then runs only for the logged entropy).
    ``share_prompts``: every forward shares each prompt's pass across its rows
    (``optim.share_prompt_forward``; ``auto`` until :meth:`for_model` has seen the policy).
    ``inactive_clips``: the clip settings chosen that cannot act (docs/algorithms.md §4).
    """

    reference: bool
    skip_redundant: bool
    entropy: bool
    clip_needs_entropy: bool
    step_kl: bool
    values: bool
    old: bool
    stale: bool
    mode_free_forward: bool
    update_epochs: int
    mini_batch_size: int
    micro_batch_size: int
    share_prompts: bool | str
    inactive_clips: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: TrainConfig, method) -> PassPlan:
        """``method`` declares ``needs_entropy``, ``clip_needs_entropy``, ``needs_step_kl``,
        ``needs_values``, ``needs_reference`` and ``needs_old``.
        Until :meth:`for_model` has seen the policy, π_old's pass is never skipped."""
        opt = cfg.optim
        skip = opt.skip_redundant_passes
        return cls(
            reference=cfg.loss.kl_coef > 0 or method.needs_reference or not skip,
            skip_redundant=skip,
            entropy=method.needs_entropy or cfg.log_entropy,
            clip_needs_entropy=method.clip_needs_entropy,
            step_kl=method.needs_step_kl,
            values=method.needs_values,
            old=method.needs_old,
            stale=cfg.rollout.lag > 0,
            mode_free_forward=False,
            update_epochs=opt.update_epochs,
            mini_batch_size=opt.mini_batch_size,
            micro_batch_size=opt.micro_batch_size,
            share_prompts=opt.share_prompt_forward,
            inactive_clips=tuple(inactive_clips(cfg, method.clip_needs_entropy)),
        )

    def for_model(self, model: torch.nn.Module) -> PassPlan:
        """The plan for this policy: π_old's pass may be skipped (``skip_redundant_passes``)
        only if train mode does not change the forward (no active dropout); prompts are shared
        where the policy can share them (`prompt_sharing_refusal`): with ``auto`` a policy that
        cannot runs the plain forward, with a warning saying why; with ``true`` it is an error."""
        skip, share = self.skip_redundant, self.share_prompts
        if share:
            refusal = prompt_sharing_refusal(model)
            if refusal and share is True:
                raise PromptSharingError(
                    f"{refusal} (optim.share_prompt_forward=auto falls back to the plain forward)"
                )
            if refusal:
                warnings.warn(
                    f"optim.share_prompt_forward=auto runs the plain forward: {refusal}",
                    stacklevel=2,
                )
            share = refusal is None
        return replace(
            self,
            mode_free_forward=skip and not train_mode_changes_forward(model),
            share_prompts=share,
        )

    def warn_inactive_clips(self) -> None:
        if self.inactive_clips:
            warnings.warn(
                f"{', '.join(self.inactive_clips)} cannot act: one update epoch over one "
                "mini-batch updates only at π_θ = π_old, where the ratio is 1 and no clip binds; "
                "set optim.mini_batch_size below the batch's rows, optim.update_epochs above 1 "
                "or rollout.lag above 0 (docs/algorithms.md §4, §4e)",
                stacklevel=3,
            )

    def on_policy(self, rows: int) -> bool:
        """Whether π_old's pass would repeat the training forward (docs/algorithms.md §4): a
        batch the current weights sampled (``rollout.lag = 0``), one epoch and one mini-batch
        over all ``rows`` (the ratio is then exactly 1 at the only
        forward), a forward that train mode does not change (no active dropout), and, for an
        entropy-dependent clip (ε needs every row's pre-update entropy before the loss), one
        micro-batch."""

        def whole(size: int) -> bool:
            return size == 0 or size >= rows

        if self.values:  # GAE needs V_old before the update starts (PPO)
            return False
        if not self.old:  # DPO: the pass only gives the pre-update entropy for the log
            return not self.entropy
        if self.stale:  # π_old sampled the batch rollout.lag steps ago (rlkit.stale)
            return False
        if not (self.mode_free_forward and self.update_epochs == 1 and whole(self.mini_batch_size)):
            return False
        return not self.clip_needs_entropy or whole(self.micro_batch_size)


def inactive_clips(cfg: TrainConfig, adaptive_clip: bool) -> list[str]:
    """The clip settings the user chose that cannot change training (docs/algorithms.md §4).

    With one update epoch over one mini-batch of a batch the current weights sampled
    (``rollout.lag = 0``) the only update happens at π_θ = π_old, where the ratio is 1 and no
    clip binds. Listed: clip-higher (ε_high ≠ ε_low), the dual clip, AGPO's
    adaptive clip and KL-Cov's penalty (0 at ρ = 1); the default symmetric ε is left out, since
    nothing was asked of it."""
    rows = cfg.rollout.num_prompts * cfg.rollout.group_size
    if cfg.rollout.lag or cfg.optim.update_epochs > 1 or 0 < cfg.optim.mini_batch_size < rows:
        return []
    loss, clips = cfg.loss, []
    if loss.eps_high != loss.eps_low:
        clips.append(f"loss.eps_high={loss.eps_high:g} (loss.eps_low={loss.eps_low:g})")
    if loss.dual_clip is not None:
        clips.append(f"loss.dual_clip={loss.dual_clip:g}")
    if adaptive_clip:
        clips.append("agpo.adaptive_clip=true")
    if loss.loss_mode == "kl_cov":  # |log π_θ − log π_old| is 0 there, with gradient 0 (§4b)
        clips.append("loss.loss_mode=kl_cov")
    return clips
