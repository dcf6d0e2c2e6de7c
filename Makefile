# poot's task runner. Every target sets up what it needs (a virtualenv in .venv) on first use.
#   make run      build + install poot, fetch the default model, serve it (poot-serve)
#   make test     build + install poot with test extras, run the Rust and Python tests
#   make develop  editable install for contributors (Python edits are live; rerun after Rust edits)
#   make lint / fmt / bench / docs / test-device-wgpu / test-device-vulkan / test-device-cuda /
#   ptx-check
#   make fuzz     atheris over the parsers of outside input (FUZZ_RUNS each; FUZZ_TARGETS)
#   make fresh-clone-check   the README's two commands on a fresh clone (before resolving issues)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# One cargo target dir for the wheel build, the editable build and cargo test.
export CARGO_TARGET_DIR ?= $(CURDIR)/target
PYTEST_ARGS ?=

.PHONY: all setup build develop run test test-rust test-python lint fmt bench docs \
        fresh-clone-check fuzz \
        test-device-wgpu test-device-vulkan test-device-cuda ptx-check cuda-device-bundle clean

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

# The main job: the OpenAI-compatible server on the default model (CPU), in the foreground
# until Ctrl-C. It prints where it listens; SERVE_ARGS passes more options (--port, --api-key).
SERVE_ARGS ?=
run: setup
	$(BIN)/poot pull
	$(BIN)/poot-serve $(SERVE_ARGS)

test: setup test-rust test-python

test-rust:
	cargo test --workspace --exclude poot-py

test-python:
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(BIN)/python
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/python scripts/check_kernel_cycles.py
	$(BIN)/ruff check python tests benches examples
	$(BIN)/ruff format --check python tests benches examples
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest poot._native
	$(BIN)/mkdocs build --strict --quiet
	@command -v nix-instantiate >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nix-bin; }
	nix-instantiate --parse flake.nix >/dev/null

fmt: $(BIN)/python
	cargo fmt --all
	$(BIN)/ruff format python tests benches examples
	$(BIN)/ruff check --fix python tests benches examples

# The pytest benches (their JSON beside the CPU table's), then the CPU table against llama.cpp
# (run `eval "$$(../shared/peers/llama-cpp.sh)"` first for the peer columns), saved as JSON and
# written into docs/performance.md's generated section with the targets judged from it.
bench: setup
	mkdir -p benches/results
	$(BIN)/python -m pytest benches --benchmark-only --benchmark-json=benches/results/benchmarks.json
	$(BIN)/python benches/bench_cpu_table.py --json benches/results/cpu_table.json --write-docs

# Fuzzing (tests/fuzz/run.py): each target FUZZ_RUNS executions, niced; crash reproducers go to
# tests/fuzz/crashes/<target>/ and tests/test_fuzz_regressions.py replays them on every test run.
FUZZ_RUNS ?= 1000000
FUZZ_TARGETS ?= gguf safetensors tokenizer_json chat_template guidance http
fuzz: setup
	$(BIN)/python -m pip install -q 'atheris>=2.3'
	for t in $(FUZZ_TARGETS); do \
		nice -n 19 $(BIN)/python tests/fuzz/run.py $$t -runs=$(FUZZ_RUNS) || exit 1; \
	done

# The documentation site (mkdocs, warnings are errors) into target/site.
docs: $(BIN)/python
	$(BIN)/mkdocs build --strict

# The README's two commands, exactly as written, on a fresh clone (scripts/fresh_clone_check.sh).
fresh-clone-check:
	bash scripts/fresh_clone_check.sh

# Loud device targets: they fail when the backend or the device is missing (skips are not proof).
# POOT_REQUIRE_WGPU=1 turns "no adapter" skips into failures.
test-device-wgpu: setup
	POOT_REQUIRE_WGPU=1 cargo test -p poot-wgpu
	POOT_REQUIRE_WGPU=1 $(BIN)/python -m pytest -m device_wgpu $(PYTEST_ARGS)

# Raw Vulkan (backend="vulkan", not production): every poot-wgpu suite on its ash device
# (POOT_GPU_API=vulkan), then the Python end-to-end tests.
test-device-vulkan: setup
	POOT_REQUIRE_WGPU=1 POOT_GPU_API=vulkan cargo test -p poot-wgpu
	POOT_REQUIRE_WGPU=1 $(BIN)/python -m pytest tests/test_vulkan_runtime.py $(PYTEST_ARGS)

# POOT_REQUIRE_CUDA=1 turns "no device" into failures (without it, poot-cuda's device suite
# runs on the CPU emulation of the driver). The bench prints matvec GB/s.
test-device-cuda: setup
	POOT_REQUIRE_CUDA=1 cargo test -p poot-cuda -- --test-threads=1
	POOT_REQUIRE_CUDA=1 cargo test -p poot-cuda --test bench -- --ignored --nocapture
	POOT_REQUIRE_CUDA=1 $(BIN)/python -m pytest -m device_cuda tests/test_cuda_runtime.py $(PYTEST_ARGS)

# Every CUDA kernel through NVRTC and ptxas for sm_80/sm_90: registers and shared memory per
# kernel (no GPU needed; fetches the NVRTC and ptxas wheels from PyPI into target/ once).
ptx-check:
	bash scripts/ptx_check.sh

# poot-cuda's test binaries and scripts/cuda_device_check.sh in .devcarry/, for a GPU
# machine with no Rust toolchain.
cuda-device-bundle:
	bash scripts/cuda_device_bundle.sh

clean:
	rm -rf $(VENV) target dist
