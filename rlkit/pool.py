"""Training runs in a pool of worker processes, each on a fixed number of torch threads.

Used by ``rlkit demo``, ``rlkit sweep`` and notebook 11 (:func:`train_and_score`). One torch
thread per run by default: one thread fixes the order of every float reduction, so a run's
numbers do not depend on the thread count the machine would pick, and the tiny model's matrices
are too small for intra-op threads to pay, so on a small machine several single-thread runs side
by side finish a batch of runs sooner than one run at a time on every core. ``threads`` and ``workers`` change the split.

Workers are started with ``spawn`` (a fresh interpreter each), so a run never inherits the
parent's torch state or threads. They die with the process that started them: killed with
``kill -9``, a pool leaves no worker training on and holding its run's lock
(:func:`die_with_parent`). ``workers=0`` runs the jobs one by one in this process (debugging,
tests).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm.auto import tqdm


def train_run(
    base: str, overrides: list[str], threads: int, resume: bool = False, overwrite: bool = False
) -> list[dict]:
    """One run of preset/YAML ``base`` plus ``overrides`` on ``threads`` torch threads (fresh,
    or resumed from its latest checkpoint); its evaluation rows."""
    from rlkit.trainer import Trainer

    cfg = worker_config(base, overrides, threads)
    return Trainer(cfg, resume=resume, overwrite=overwrite).train()


def worker_config(base: str, overrides: list[str], threads: int):
    """A pool worker's set-up on ``threads`` torch threads, and its run's config."""
    import torch
    import transformers

    from rlkit import show_warnings_plainly
    from rlkit.config import load_config

    show_warnings_plainly()  # the worker's warnings print as the command's own do
    torch.set_num_threads(threads)
    transformers.logging.disable_progress_bar()  # the pool's bar over runs is the one to read
    return load_config(base, overrides)


def train_and_score(base: str, overrides: list[str], threads: int, train: bool = True):
    """Train run ``base`` + ``overrides`` on ``threads`` torch threads, or with ``train=False``
    only load its starting policy, and return its last held-out evaluation problem by problem
    (:class:`rlkit.evaluation.EvalScores`, greedy completions included): the per-problem pairing
    notebook 11 makes, from runs trained side by side in a pool.

    A run of this config already in its directory is continued, not repeated
    (:func:`rlkit.checkpoint.run_progress`): a killed one resumes from its latest checkpoint and
    goes on as the same run, a finished one has its last checkpoint scored. Anything else there
    (another run, one killed before its first checkpoint) is replaced by a fresh run."""
    from rlkit.checkpoint import run_progress
    from rlkit.trainer import Trainer

    cfg = worker_config(base, overrides, threads)
    if train:
        try:
            progress = run_progress(cfg)
        except ValueError:  # another run's directory: replaced, as ``--overwrite`` would
            progress = "fresh"
        if progress != "done":  # the last step (steps >= 1, checked by the config) evaluates
            trainer = Trainer(cfg, resume=progress == "resume", overwrite=progress == "fresh")
            trainer.train()
            return trainer.eval_scores
    # the starting policy, or the finished run's last checkpoint
    trainer = Trainer(cfg, resume=train, read_only=True)
    try:
        trainer.evaluate()
        return trainer.eval_scores
    finally:
        trainer.close()


PARENT_POLL_S = 0.2  # how often a pool worker checks that its parent is still there


def die_with_parent(parent: int) -> None:
    """Pool-worker initializer: a daemon thread ends this process as soon as ``parent`` (the
    process that started the pool) is gone, however it ended. An orphan is re-parented, so its
    parent pid changes; polling it works on every POSIX system (Linux's PR_SET_PDEATHSIG does
    not exist on macOS). The kernel then drops the run lock the worker held."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # no cleanup: the parent that would read a result is gone

    threading.Thread(target=watch, name="rlkit-watch-parent", daemon=True).start()


def default_workers(num_jobs: int, threads: int) -> int:
    """As many runs in parallel as there are cores for them at ``threads`` each."""
    return max(1, min(num_jobs, (os.cpu_count() or 1) // threads))


def run_pool(
    fn: Callable,
    jobs: Mapping[Hashable, tuple],
    workers: int,
    progress: bool = True,
    desc: str = "runs",
    initial: int = 0,
    total: int | None = None,
) -> dict:
    """``fn(*args)`` for every ``key: args`` of ``jobs`` on ``workers`` processes; {key: result}.

    A failing job does not stop the others: once every job has ended, a RuntimeError names the
    failed keys (the first error chained). The progress bar counts ``initial`` jobs done before
    this call out of ``total`` (default: ``initial + len(jobs)``).
    """
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    results, errors = {}, {}
    bar = tqdm(
        total=initial + len(jobs) if total is None else total,
        initial=initial,
        desc=desc,
        disable=not progress,
    )

    def finish(key, call):
        try:
            results[key] = call()
        except Exception as err:  # noqa: BLE001 - reported below, with the job's key
            errors[key] = err
        bar.update(1)

    try:
        if workers == 0:
            for key, args in jobs.items():
                finish(key, lambda args=args: fn(*args))
        elif jobs:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                min(workers, len(jobs)),
                mp_context=context,
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            ) as pool:
                futures = {pool.submit(fn, *args): key for key, args in jobs.items()}
                for future in as_completed(futures):
                    finish(futures[future], future.result)
    finally:
        bar.close()
    if errors:
        first = next(iter(errors))
        raise RuntimeError(
            f"{len(errors)} of {len(jobs)} {desc} failed: {', '.join(map(str, errors))}; "
            f"first error ({first}): {errors[first]}"
        ) from errors[first]
    return results
