"""Verifiable rewards and a fault-tolerant batch scorer.

A reward function maps ``(completion, reference answer)`` to a float. `RewardScorer` applies one
to a batch, in-process or in worker processes with a per-item timeout. A reward that raises,
returns a non-finite value or times out is counted and logged, then scored 0 (``on_error="warn"``)
or turned into a `RuntimeError` (``on_error="raise"``): a failure is never a silent 0.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import numbers
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait

import numpy as np
import torch

from rlkit.answers import extract_answer, last_boxed, normalize_answer, numeric_value

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str], float]
WORKER_START_TIMEOUT_S = 120.0


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's answer key (`rlkit.answers.extract_answer`) equals the reference.

    The reference is normalised the same way (its ``\\boxed{}`` content if it has one); when both
    sides are numbers (`rlkit.answers.numeric_value`: integers, decimals, fractions ``a/b``) they
    are compared numerically, so ``32.0`` matches ``32`` and ``6/8`` matches ``3/4`` and ``0.75``.
    """
    predicted = extract_answer(completion)
    boxed = last_boxed(answer)
    reference = normalize_answer(boxed if boxed is not None else answer)
    predicted_number, reference_number = numeric_value(predicted), numeric_value(reference)
    if predicted_number is not None and reference_number is not None:
        return float(math.isclose(predicted_number, reference_number, rel_tol=1e-9, abs_tol=1e-9))
    return float(predicted == reference)


def math_verify_reward(completion: str, answer: str) -> float:
    """1.0 if `math_verify` finds the completion's answer equivalent to the reference.

    The reference is wrapped in ``$…$`` unless it already has LaTeX delimiters or a ``\\boxed{}``.
    Parser and verifier errors (including math_verify's own timeouts) propagate, so the scorer
    counts them instead of reading them as a wrong answer.
    """
    from math_verify import parse, verify  # imports sympy: only on first use

    has_delimiters = "$" in answer or "\\boxed" in answer or "\\(" in answer
    gold = parse(answer if has_delimiters else f"${answer}$", raise_on_error=True)
    prediction = parse(completion, raise_on_error=True)
    return float(verify(gold, prediction, raise_on_error=True))


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "exact_match": exact_match_reward,
    "math_verify": math_verify_reward,
}


def get_reward_fn(name: str) -> RewardFn:
    """Look a reward function up by name; a `ValueError` lists the known names."""
    if name not in REWARD_FUNCTIONS:
        raise ValueError(f"reward: unknown reward {name!r}; known: {sorted(REWARD_FUNCTIONS)}")
    return REWARD_FUNCTIONS[name]


@dataclass
class RewardBatch:
    """Scores of one batch: ``rewards[i]`` belongs to input i; failures are scored 0 and counted."""

    rewards: torch.Tensor  # float32 [N]
    num_errors: int
    num_timeouts: int


FLOAT32_MAX = 3.4028234663852886e38


def _is_timeout(error: BaseException) -> bool:
    """A timeout raised by the reward itself: ``TimeoutError``, or math_verify's own
    ``TimeoutException`` (a BaseException; its module is loaded whenever it was raised)."""
    errors = sys.modules.get("math_verify.errors")
    return isinstance(error, TimeoutError) or (
        errors is not None and isinstance(error, errors.TimeoutException)
    )


def _is_bool(raw: object) -> bool:
    """A Python or NumPy bool, or a bool-typed tensor or array (``torch.tensor(True)``)."""
    if isinstance(raw, (torch.Tensor, np.ndarray)):
        return raw.dtype in (torch.bool, np.bool_)
    return isinstance(raw, (bool, np.bool_))


def _call(fn: RewardFn, completion: str, answer: str) -> tuple[float | None, str | None, bool]:
    """``(reward, None, False)``, or ``(None, error description, timed out)``.

    A reward must be a real number, or a tensor or array holding one (a bool of any kind, a
    string or None is an error, not coerced: ``True`` scoring 1.0 would hide a reward that
    returns a verdict instead of a score) that is finite in float32, the dtype rewards are kept
    in (1e308 is finite in float64 but not there).
    """
    try:
        raw = fn(completion, answer)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # any failure of user code is reported, not raised here
        return None, f"{type(error).__name__}: {error}", _is_timeout(error)
    if _is_bool(raw) or not isinstance(raw, (numbers.Real, torch.Tensor, np.ndarray)):
        return None, f"reward is a {type(raw).__name__} ({raw!r}), not a number", False
    try:
        value = float(raw)
    except (TypeError, ValueError, RuntimeError) as error:  # e.g. a tensor of several values
        return None, f"reward {raw!r} is not a single number: {error}", False
    if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        return None, f"non-finite reward {value} (rewards must be finite in float32)", False
    return value, None, False


def _worker_loop(connection, pickled_fn: bytes) -> None:
    """Worker process: load the reward function (or report why it cannot be imported here),
    announce readiness, then score (index, completion, answer) messages."""
    try:
        fn = pickle.loads(pickled_fn)
    except Exception as error:  # e.g. a function of a notebook's __main__, unknown here
        connection.send(("unimportable", f"{type(error).__name__}: {error}"))
        return
    connection.send("ready")
    while True:
        try:
            index, completion, answer = connection.recv()
        except EOFError:  # the parent went away
            return
        connection.send((index, *_call(fn, completion, answer)))


def _describe(fn: RewardFn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _pickle_reward(fn: RewardFn) -> bytes:
    """``fn`` as worker processes receive it: pickled by reference (module and name)."""
    try:
        return pickle.dumps(fn)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(
            f"reward function {_describe(fn)} cannot be sent to reward worker processes "
            f"({type(error).__name__}: {error}); define it at module level in an importable "
            ".py file, or score in-process (num_workers=0, task.reward_workers=0)"
        ) from None


class _Worker:
    """One spawned scoring process and its pipe."""

    def __init__(self, context, fn: RewardFn, pickled_fn: bytes):
        self.fn = fn
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_loop, args=(child, pickled_fn), daemon=True)
        self.process.start()
        child.close()
        self.index: int | None = None  # item in flight
        self.started = 0.0  # when that item was sent

    def wait_ready(self) -> None:
        try:
            message = (
                self.connection.recv() if self.connection.poll(WORKER_START_TIMEOUT_S) else None
            )
        except EOFError:  # the process died before it could say why
            message = None
        if message == "ready":
            return
        self.kill()
        if isinstance(message, tuple):
            raise RuntimeError(
                f"reward worker processes cannot import the reward function {_describe(self.fn)} "
                f"({message[1]}): a worker is a fresh Python process, so the function must be "
                "defined at module level in a .py file it can import, not in __main__ or a "
                "notebook; or score in-process (num_workers=0, task.reward_workers=0)"
            )
        raise RuntimeError("reward worker process failed to start")

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def submit(self, index: int, completion: str, answer: str) -> None:
        self.index, self.started = index, time.monotonic()
        self.connection.send((index, completion, answer))

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class RewardScorer:
    """Scores batches with `fn`, counting and logging every failure.

    Args:
        fn: reward function ``(completion, answer) -> float``. With workers it must be picklable
            (a module-level function): workers are fresh processes started by a forkserver that
            has `rlkit.rewards` preloaded (same pickling rules as spawn, but quicker restarts).
        num_workers: 0 scores in this process (no timeout is enforced: a hanging `fn` hangs the
            caller); N > 0 keeps N worker processes and kills (then replaces) any that exceed the
            timeout, so a hung reward never hangs the caller.
        timeout_s: per-item limit, measured from when a worker receives the item.
        on_error: ``"warn"`` scores failures 0 and logs a warning with the counts; ``"raise"``
            raises `RuntimeError` after the batch.

    Use as a context manager, or call `close()`, to stop the workers.
    """

    def __init__(
        self,
        fn: RewardFn = exact_match_reward,
        num_workers: int = 0,
        timeout_s: float = 10.0,
        on_error: str = "warn",
    ):
        self._workers: list[_Worker] = []
        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error must be 'warn' or 'raise', got {on_error!r}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.on_error = on_error
        self._pickled_fn = _pickle_reward(fn) if num_workers else b""
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["rlkit.rewards"])

    def score(self, completions: Sequence[str], answers: Sequence[str]) -> RewardBatch:
        """Rewards for ``zip(completions, answers)``, aligned with the inputs."""
        if len(completions) != len(answers):
            raise ValueError(
                f"completions and answers differ in length: {len(completions)} != {len(answers)}"
            )
        if self.num_workers == 0:
            results = [_call(self.fn, c, a) for c, a in zip(completions, answers)]
        else:
            results = self._score_in_workers(completions, answers)
        errors = [(i, error) for i, (_, error, _) in enumerate(results) if error is not None]
        timed_out = [i for i, (_, _, timeout) in enumerate(results) if timeout]
        num_errors = len(errors) - len(timed_out)
        rewards = torch.tensor([value or 0.0 for value, _, _ in results], dtype=torch.float32)
        if errors:
            message = (
                f"{len(errors)} of {len(results)} rewards failed ({num_errors} errors, "
                f"{len(timed_out)} timeouts after {self.timeout_s}s); first: item {errors[0][0]}: "
                f"{errors[0][1]}"
            )
            if self.on_error == "raise":
                raise RuntimeError(message)
            logger.warning("%s; scored 0", message)
        return RewardBatch(rewards, num_errors=num_errors, num_timeouts=len(timed_out))

    def _score_in_workers(self, completions, answers):
        self._start_workers()
        results: list[tuple[float | None, str | None, bool]] = [(None, "not scored", False)] * len(
            completions
        )
        pending = list(range(len(completions)))[::-1]
        busy: dict[object, _Worker] = {}
        while pending or busy:
            for worker in list(self._workers):
                if worker.index is None and pending:
                    index = pending.pop()
                    try:
                        worker.submit(index, completions[index], answers[index])
                    except OSError:  # it died while idle (BrokenPipeError): retry on a new one
                        pending.append(index)
                        self._replace(worker)
                        continue
                    busy[worker.connection] = worker
            if not busy:
                continue
            deadline = min(w.started for w in busy.values()) + self.timeout_s
            for connection in wait(list(busy), timeout=max(0.0, deadline - time.monotonic())):
                worker = busy.pop(connection)
                try:
                    index, *result = connection.recv()
                except EOFError:  # the worker died (e.g. killed by the OS)
                    results[worker.index] = (None, "reward worker process died", False)
                    self._replace(worker)
                    continue
                results[index], worker.index = tuple(result), None
            now = time.monotonic()
            for connection, worker in list(busy.items()):
                if now - worker.started >= self.timeout_s:
                    del busy[connection]
                    results[worker.index] = (None, f"timed out after {self.timeout_s}s", True)
                    self._replace(worker)
        return results

    def _start_workers(self) -> None:
        """Top the pool up to ``num_workers`` live workers (one that died between batches, e.g.
        killed by the OS, is replaced here)."""
        for worker in [w for w in self._workers if not w.alive]:
            worker.kill()
            self._workers.remove(worker)
        new = [
            _Worker(self._context, self.fn, self._pickled_fn)
            for _ in range(self.num_workers - len(self._workers))
        ]
        for worker in new:
            worker.wait_ready()
        self._workers += new

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._start_workers()

    def close(self) -> None:
        """Stop the worker processes."""
        for worker in self._workers:
            worker.kill()
        self._workers = []

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
