"""A sweep's summary as ``rlkit report`` writes it (``results/<sweep>/summary.json``), read:
the held-out metrics it summarizes (:data:`METRICS`), an arm's row (:func:`summary_row`) and the
per-seed end values a paired comparison or a claim reads (:func:`end_by_seed`)."""

from __future__ import annotations

METRICS = ("eval/greedy_accuracy", "eval/pass@1")  # what rlkit report summarizes (and claims test)


def summary_row(summary: dict, arm: str, metric: str, group_size: int | None = None) -> dict:
    """The summary's row of ``arm`` for ``metric`` (and G); a clear error when it is absent."""
    for r in summary["rows"]:
        if r["arm"] == arm and r["metric"] == metric and group_size in (None, r["group_size"]):
            return r
    raise KeyError(f"{summary['name']}: no row for arm {arm!r}, metric {metric!r}, G {group_size}")


def end_by_seed(summary: dict, arm: str, metric: str, group_size: int | None = None) -> dict:
    """The per-seed end values of ``arm``'s row; a ValueError naming the summary file and the
    key when the row has none (summaries written before rlkit report stored them)."""
    row = summary_row(summary, arm, metric, group_size)
    if "end_by_seed" not in row:
        rerun = summary.get("commands", ["rlkit report <sweep dir>"])[-1]
        raise ValueError(
            f"{summary['name']}/summary.json: the row of arm {arm!r}, metric {metric!r} has no "
            f"'end_by_seed' (per-seed end values; an older rlkit report wrote it), so no paired "
            f"comparison can be made; regenerate it from the runs: {rerun}"
        )
    return row["end_by_seed"]
