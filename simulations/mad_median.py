"""The AGPO authors' MAD median (``agpo.mad_median=lower``) against rlkit's ``midpoint``, measured
on the 0/1 rewards of the warm start (docs/algorithms.md §1, the two conventions).

At even G the two medians differ, and on 0/1 rewards that changes the MAD only on half-success
groups (G/2 successes): ``midpoint`` gives 1.4826 · 0.5, ``lower`` gives 0 and so falls back to
the std. This module asks how often such groups occur, and how far the ``agpo`` advantage moves:
every quantity comes from rlkit's own ``dispersion`` and ``agpo`` estimator, evaluated on each
possible group (s successes of G), then weighted by the chance of drawing that group.

A prompt with c successes among k samples gives a G-subset (drawn without replacement) s
successes with the hypergeometric probability C(c, s)·C(k − c, G − s) / C(k, G), the same
sampling ``rlkit.null_groups`` uses, so one sample of k completions per prompt serves every G ≤ k.

    python -m simulations.mad_median                    # default task, 512 prompts, k = 16, T = 1
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from rlkit.advantages import get_estimator
from rlkit.config import load_config
from rlkit.null_groups import GROUP_SIZES, sampled_successes, subset_success_weights
from rlkit.stats import MAD_MEDIANS, dispersion, group_std


def every_group(group_size: int) -> torch.Tensor:
    """[G + 1, G] float64 0/1 rewards: row s holds s successes (the order within a group changes
    neither its dispersion nor the multiset of its advantages)."""
    s = torch.arange(group_size + 1).unsqueeze(1)
    return (torch.arange(group_size).unsqueeze(0) < s).to(torch.float64)


def convention_rows(group_size: int) -> dict[str, torch.Tensor]:
    """Per success count s = 0 … G (tensors of length G + 1), for each convention in
    ``MAD_MEDIANS``: its MAD dispersion (``disp_<name>``) and whether that is the std fallback
    (``fallback_<name>``); and ``abs_delta_advantage``, the mean over the G completions of
    |A_midpoint − A_lower| of the ``agpo`` advantage with ``dispersion=mad``, and
    ``abs_advantage_midpoint``, the mean |A_midpoint| (the scale that difference is read on).

    The fallback is read off as "dispersion equals the std on a non-constant group". On 0/1
    rewards that is exact: the unscaled MAD is 0, ½ or 1, so the robust value is 0, 0.741 or
    1.483, while the ddof = 1 std of a non-constant 0/1 group lies in (0, 0.71]."""
    rewards = every_group(group_size)
    std = group_std(rewards, dim=1, ddof=1)
    out, advantages = {}, {}
    for name in MAD_MEDIANS:
        disp = dispersion(rewards, "mad", dim=1, ddof=1, mad_median=name)
        out[f"disp_{name}"] = disp
        out[f"fallback_{name}"] = (std > 0) & (disp == std)
        advantages[name] = get_estimator("agpo", dispersion="mad", mad_median=name)(
            rewards
        ).advantages
    out["abs_delta_advantage"] = (advantages["midpoint"] - advantages["lower"]).abs().mean(1)
    out["abs_advantage_midpoint"] = advantages["midpoint"].abs().mean(1)
    return out


def compare(successes: Sequence[int], k: int, group_sizes=GROUP_SIZES) -> dict[int, dict]:
    """{G: shares of G-groups} for prompts with ``successes`` among k samples each:

    - ``differ``: the two conventions give a different dispersion;
    - ``lower_zero_fallback``: ``lower``'s MAD is 0 on a non-constant group and falls back to the
      std (``midpoint_zero_fallback`` likewise);
    - ``mean_abs_delta_advantage``: E|A_midpoint − A_lower| per completion over all groups, and
      ``..._where_differ`` the same over the groups that differ (nan if none);
    - ``mean_abs_advantage_midpoint``: E|A_midpoint| per completion over all groups."""
    out = {}
    for g in group_sizes:
        w = torch.from_numpy(subset_success_weights(successes, k, g))
        rows = convention_rows(g)
        differ = rows["disp_midpoint"] != rows["disp_lower"]
        delta = float((w * rows["abs_delta_advantage"]).sum())
        share = float(w[differ].sum())
        out[g] = {
            "differ": share,
            "lower_zero_fallback": float(w[rows["fallback_lower"]].sum()),
            "midpoint_zero_fallback": float(w[rows["fallback_midpoint"]].sum()),
            "mean_abs_delta_advantage": delta,
            "mean_abs_delta_advantage_where_differ": delta / share if share > 0 else float("nan"),
            "mean_abs_advantage_midpoint": float((w * rows["abs_advantage_midpoint"]).sum()),
        }
    return out


def format_table(shares: dict[int, dict], title: str = "") -> str:
    lines = [title] if title else []
    lines += [
        "|  G | dispersions differ | `lower` MAD 0 → std | `midpoint` MAD 0 → std "
        "| mean abs Δ advantage | where they differ | mean abs advantage (`midpoint`) |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, s in shares.items():
        lines.append(
            f"| {g:2d} | {s['differ']:.1%} | {s['lower_zero_fallback']:.1%} "
            f"| {s['midpoint_zero_fallback']:.1%} | {s['mean_abs_delta_advantage']:.4f} "
            f"| {s['mean_abs_delta_advantage_where_differ']:.4f} "
            f"| {s['mean_abs_advantage_midpoint']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny-cpu", help="preset or YAML (default tiny-cpu)")
    parser.add_argument("--prompts", type=int, default=512, help="training prompts sampled")
    parser.add_argument("--k", type=int, default=16, help="samples per prompt (at T = rollout's)")
    parser.add_argument("--seed", type=int, default=0, help="the prompt subset's seed")
    parser.add_argument("--group-sizes", type=int, nargs="+", default=list(GROUP_SIZES))
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, [*args.overrides, "tensorboard=false"])
    successes = sampled_successes(cfg, args.k, args.prompts, args.seed)
    title = (
        f"{' '.join([args.config, *args.overrides])}: {len(successes)} training prompts "
        f"(subset seed {args.seed}, config seed {cfg.seed}), k = {args.k} at "
        f"T = {cfg.rollout.temperature}"
    )
    print(format_table(compare(successes, args.k, tuple(args.group_sizes)), title))


if __name__ == "__main__":
    main()
