# poot's task runner. Every target sets up what it needs (a virtualenv in .venv) on first use.
#   make run      build + install poot, fetch the default model, run the main job
#   make test     build + install poot with test extras, run the Rust and Python tests
#   make develop  editable install for contributors (Python edits are live; rerun after Rust edits)
#   make lint / fmt / bench / test-device-wgpu / test-device-cuda

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# One cargo target dir for the wheel build, the editable build and cargo test.
export CARGO_TARGET_DIR ?= $(CURDIR)/target
PYTEST_ARGS ?=

.PHONY: all setup build develop run test test-rust test-python lint fmt bench \
        test-device-wgpu test-device-cuda clean

all: build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Release wheel (LTO) installed into the venv with the test and dev extras.
setup build: $(BIN)/python
	$(BIN)/python -m pip install -q '.[test,dev]'

# Contributor path: editable install, unoptimized native module (fast to rebuild).
develop: $(BIN)/python
	MATURIN_PEP517_ARGS="--profile dev" $(BIN)/python -m pip install -q -e '.[test,dev]'

# The main job. Until the server lands, it generates with the default model on the CPU.
PROMPT ?= The capital of France is
run: setup
	$(BIN)/poot pull
	$(BIN)/poot generate --max-tokens 32 --temperature 0 "$(PROMPT)"

test: setup test-rust test-python

test-rust:
	cargo test --workspace --exclude poot-py

test-python:
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(BIN)/python
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest poot._native
	@command -v nix-instantiate >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nix-bin; }
	nix-instantiate --parse flake.nix >/dev/null

fmt: $(BIN)/python
	cargo fmt --all
	$(BIN)/ruff format python tests benches
	$(BIN)/ruff check --fix python tests benches

bench: setup
	$(BIN)/python -m pytest benches --benchmark-only

# Loud device targets: they fail when the backend or the device is missing (skips are not proof).
# POOT_REQUIRE_WGPU=1 turns "no adapter" skips into failures.
test-device-wgpu: setup
	POOT_REQUIRE_WGPU=1 cargo test -p poot-wgpu
	POOT_REQUIRE_WGPU=1 $(BIN)/python -m pytest -m device_wgpu $(PYTEST_ARGS)

test-device-cuda:
	@echo "the CUDA backend is not built yet; nothing can be tested" >&2; exit 1

clean:
	rm -rf $(VENV) target dist
