# The two quick-start commands: `make demo` (main job) and `make test` (whole suite).
# Both create the virtual environment .venv on first use (CPU torch 2.13.0 + rlkit[test]).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/rlkit demo

# Notebooks run at their reduced CI scale here (RLKIT_NB_SCALE=ci); pytest exits non-zero
# when it collects no test, so an empty run fails.
test: venv
	RLKIT_NB_SCALE=ci $(BIN)/python -m pytest --nbval-lax -p no:cacheprovider

bench: venv
	$(BIN)/python benchmarks/bench_estimators.py

clean:
	rm -rf $(VENV) .cache runs
