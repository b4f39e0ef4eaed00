# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: demo test test-fast lab console lint bench bench-smoke soak install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Stamp files: re-install only when the dependency list or the JupyterLab extension's sources change
# (the install runs its npm build when the sources are newer than build/labextension: hatch_build's
# jupyter-builder hook, pyproject.toml).
LABEXT := $(addprefix labextension/,package.json package-lock.json build.js tsconfig.json) $(wildcard labextension/src/*.ts labextension/style/*)
$(VENV)/.installed: pyproject.toml $(LABEXT) | $(PY)
	$(PIP) install --quiet -e .
	$(VENV)/bin/ivralo-kernel install --sys-prefix
	touch $@

$(VENV)/.installed-test: pyproject.toml $(LABEXT) | $(PY)
	$(PIP) install --quiet -e '.[test]'
	$(VENV)/bin/ivralo-kernel install --sys-prefix
	touch $@ $(VENV)/.installed

$(VENV)/.installed-lab: pyproject.toml $(LABEXT) | $(PY)
	$(PIP) install --quiet -e '.[lab]'
	$(VENV)/bin/ivralo-kernel install --sys-prefix
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

# Jupyter Enterprise Gateway pins jupyter_client<7: it gets a venv of its own, from which
# tests/test_enterprise_gateway.py starts it (it launches ivralo's kernel from $(VENV)).
EG_VENV ?= .venv-eg
$(EG_VENV)/.installed:
	$(PYTHON) -m venv $(EG_VENV)
	$(EG_VENV)/bin/python -m pip install --quiet 'jupyter-enterprise-gateway==3.3.*'
	touch $@

# The main job: a guarded session runs the tour notebook headless and shows what each guard did,
# then the broker notebook, against a loopback API (notebooks/demo_api.py) and the demo database.
# The credentials are set in the host only, to show that the kernel never sees them.
# tests/test_notebooks.py runs every notebook the same way.
DEMO_ENV := DEMO_API_KEY=sk-demo-not-for-the-kernel DEMO_SHOP_DB_URL=sqlite:///$(CURDIR)/.demo-data/shop.db \
	IVRALO_CONFIG_HOME=$(CURDIR)/.demo-data/config

demo: $(VENV)/.installed
	rm -rf .demo-workspace && mkdir .demo-workspace
	$(PY) notebooks/demo_data.py .demo-data/shop.db .demo-data/config
	$(DEMO_ENV) $(VENV)/bin/ivralo-kernel run notebooks/tour.ipynb \
		--workspace .demo-workspace --memory-limit 1073741824 --grant databases
	@echo "Kept by the write guard before the tour overwrote a file (.demo-workspace/.ivralo/history/):"
	@cat .demo-workspace/.ivralo/history/index.jsonl
	$(DEMO_ENV) $(PY) notebooks/demo_api.py .demo-data/config -- $(VENV)/bin/ivralo-kernel run notebooks/broker.ipynb \
		--workspace .demo-workspace --memory-limit 1073741824 --grant databases --grant shop

test: $(VENV)/.installed-test $(EG_VENV)/.installed lint
	$(PY) -m pytest --durations=40  # the slowest, in CI's log: its 25 minutes are nearly used

# The fast tier: tests that start no kernel and no process (under 30 s); `make test` runs them too.
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -m fast

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check ivralo_kernel tests bench deploy
	$(VENV)/bin/ruff format --check ivralo_kernel
	$(VENV)/bin/mypy

lab: $(VENV)/.installed-lab
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# The same kernel and host side as JupyterLab's, in a terminal (jupyter-console is in the lab extra).
console: $(VENV)/.installed-lab
	$(VENV)/bin/jupyter console --kernel ivralo

# Every benchmark through one harness (bench/harness.py), ivralo against plain ipykernel, < 15 min:
# results.json, summary.md and PNG plots in bench/results/<UTC>-full/; the summary goes to the top
# of bench/README.md with the machine it ran on.
bench: $(VENV)/.installed-test
	$(PY) bench/harness.py --size full --update-readme

# The same harness at tiny sizes, < 2 min: asserts nothing about speed, only that every benchmark
# ran and wrote its files (CI runs it after the tests).
bench-smoke: $(VENV)/.installed-test
	$(PY) bench/harness.py --size smoke

# The soak (issue 30): N agent sessions plus a jupyter_server's kernels over its websocket, for M
# minutes of mixed calls and faults; fails on a hang, a leaked process, folder or fd, or RSS growth.
# Results in bench/results/<UTC>-soak/. CI runs a two-minute version (tests/test_soak.py).
N ?= 8
M ?= 10
SOAK_ARGS ?=
soak: $(VENV)/.installed-test
	$(PY) bench/soak.py --sessions $(N) --minutes $(M) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(EG_VENV) .pytest_cache .mypy_cache .ruff_cache bench/results
