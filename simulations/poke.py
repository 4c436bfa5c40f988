"""One run of one arm of a sweep, trained by hand: the "poke one arm" exercises of notebooks 08
and 09.

``rlkit sweep`` trains every arm × group size × seed of its spec. :func:`poke_overrides` returns
the overrides of one of those runs exactly as the sweep plans them (:func:`rlkit.sweep.plan`),
then the student's changes, then an output folder of the notebook's own, so that the run can be
trained with :func:`rlkit.pool.train_run` and set beside the committed sweep's seeds.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.sweep import parse_spec, plan


def poke_overrides(
    spec_path: str | Path,
    arm: str,
    seed: int,
    output_dir: str | Path,
    group_size: int | None = None,
    changes: list[str] | tuple[str, ...] = (),
) -> tuple[str, list[str]]:
    """(base config, overrides) of the sweep's run ``arm``/G``group_size``/seed``seed``, with
    ``changes`` applied after the sweep's own overrides and ``output_dir`` last. ``group_size``
    may be left out when the spec has one group size (or none). An arm, seed or group size the
    spec does not run is a ValueError naming what it does run."""
    spec = parse_spec(spec_path)
    runs = [
        run
        for run in plan(spec)
        if run.arm == arm and run.seed == seed and group_size in (None, run.group_size)
    ]
    if not runs:
        raise ValueError(
            f"{spec_path} runs no arm {arm!r} at seed {seed}"
            + (f" and G = {group_size}" if group_size is not None else "")
            + f": its arms are {list(spec.arms)}, seeds {spec.seeds}, group sizes "
            f"{spec.group_sizes or 'from its base config'}"
        )
    if len(runs) > 1:
        sizes = sorted(run.group_size for run in runs)
        raise ValueError(f"{spec_path} runs arm {arm!r} at G = {sizes}: pass group_size")
    return spec.base, [*runs[0].overrides, *changes, f"output_dir={output_dir}"]
