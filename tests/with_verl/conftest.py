"""tests/with_verl/ needs the real verl package, which lives in its own environment (`make
test-verl`, .venv-verl): without verl, nothing here is collected, so the main suite skips it and
a verl run whose environment lacks verl collects no test, which pytest reports as a failure."""

import importlib.util

if importlib.util.find_spec("verl") is None:
    collect_ignore_glob = ["test_*.py"]
