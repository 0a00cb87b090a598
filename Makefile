# The two commands a new user needs: `make demo` and `make test`. Both build .venv themselves.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A bare `torch` requirement can pull a multi-GB CUDA build; where no NVIDIA GPU is present,
# install the CPU build first so the project's own requirement is already satisfied.
HAS_NVIDIA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_VERSION ?= 2.13.0

.PHONY: venv demo test lint typecheck unit fmt clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAS_NVIDIA),1)
	$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"
else
	@# a local or mirrored CPU wheel first, then PyTorch's CPU index with a short timeout and no
	@# retries (an unreachable index must not stall the install), then the plain requirement
	$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	  || $(BIN)/python -m pip install -q --timeout 5 --retries 0 "torch==$(TORCH_VERSION)" \
	       --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
	  || $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"
endif
	$(BIN)/python -m pip install -q -e ".[dev,postgres,mlx,hf,data]"
	@# compile the payload decoder's numba walk once, so node processes only load it (~1 s)
	$(BIN)/python -c "from distronet.node.daemon.parts import warm_compiled_decoder; warm_compiled_decoder()"
	touch $(STAMP)

# trains until Ctrl-C (then prints the summary); DEMO_STEPS=N make demo stops after N steps
demo: venv
	$(BIN)/python -m distronet.node.demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy -p distronet

# two xdist workers (CI's machine has 2 cores); the groups that keep shared resources apart are
# in tests/conftest.py (docs/decisions/parallel-tests.md). TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
test: venv lint typecheck
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

unit: venv
	$(BIN)/python -m pytest -q tests/unit

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) build *.egg-info
