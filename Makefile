# One command to run, one to test. Both set up .venv first (once; again only when
# pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Jupyter refuses to run as root unless told; sessions and CI run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup tools lab demo test bench lint clean labextension

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Pinned here only: the CPU wheel on local disk. Unpinned torch resolves to a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	# The committed build of the lab extension, as is: no npm rebuild here, which took a minute
	# and left the git tree dirty (`make labextension` rebuilds it from labextension/).
	SKIP_JUPYTER_BUILDER=1 $(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

labextension:  ## rebuild the committed lab extension and notebook timeline from labextension/
	cd labextension && npm ci --no-audit --no-fund && npm run build && npm test

lab: $(STAMP)  ## JupyterLab with the inference server on the default engine
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/01_quickstart.ipynb

demo: $(STAMP)  ## the terminal demo: sequential requests, bursts, batches
	$(BIN)/jupyter infer demo

# lm-eval and guidellm, each in .venv-tools/<name> (their pins conflict); once, then reused.
tools: $(STAMP)
	$(BIN)/python tests/tool_venvs.py

test: $(STAMP) tools
	$(BIN)/python -m pytest -q

bench: $(STAMP)  ## ours against the other servers and libraries (benchmarks/; `jupyter infer bench`: ours alone)
	$(BIN)/python -m benchmarks

lint: $(STAMP)
	$(BIN)/ruff check jupyter_infer tests benchmarks

clean:
	rm -rf $(VENV) .venv-tools
