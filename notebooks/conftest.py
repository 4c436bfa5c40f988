"""nbval runs each notebook in a kernel of its own. At CI scale (``make test``) a kernel writes its
figures and runs to a temporary folder (:func:`simulations.scale.output_dir`), but nbval kills the
kernel, so the kernel cannot remove that folder itself. Here the kernels get a ``TMPDIR`` of this
pytest session's own, removed when the session ends: ``make test`` leaves nothing behind, neither
in the checkout nor in the system's temporary folder.

The kernels also get ``RLKIT_EXERCISE_ANSWERS=reference`` (unless it is set already): every
exercise's check then runs on its reference answer (simulations/exercises.py), so each checking
assert runs here; a student's own run, without it, checks the student's answers."""

import os
import shutil
import tempfile

ANSWERS_ENV = "RLKIT_EXERCISE_ANSWERS"  # simulations.exercises.ANSWERS_ENV
_SESSION_TMP: dict[str, str | None] = {}


def pytest_sessionstart(session):
    tempfile.gettempdir()  # this process keeps the system folder; only its children move
    _SESSION_TMP["dir"] = tempfile.mkdtemp(prefix="rlkit-nbval-")
    _SESSION_TMP["previous"] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = _SESSION_TMP["dir"]
    _SESSION_TMP["answers"] = os.environ.get(ANSWERS_ENV)
    os.environ.setdefault(ANSWERS_ENV, "reference")


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_TMP.get("answers") is None:
        os.environ.pop(ANSWERS_ENV, None)
    if _SESSION_TMP.get("previous") is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _SESSION_TMP["previous"]
    shutil.rmtree(_SESSION_TMP.pop("dir"), ignore_errors=True)
