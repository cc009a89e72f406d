# Thin wrappers over CMake. `make demo` and `make test` work on a fresh Debian machine: they
# install the missing Debian packages (apt-get) and Python packages (pip) first.
BUILD_DIR ?= build
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)
PYTHON ?= python3

DEB_PACKAGES := cmake g++ make nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev \
                libbenchmark-dev
PY_PACKAGES := numpy pytest nanobind scikit-build-core hypothesis

.PHONY: all deps build demo test test-cpp test-python sanitize bench clean format

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -c "import numpy, pytest, nanobind, scikit_build_core, hypothesis" 2>/dev/null || \
	  $(PYTHON) -m pip install -q $(PY_PACKAGES)

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSE_SWA_PYTHON=ON \
	  -DPython_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	./$(BUILD_DIR)/sparse-swa demo

test: build
	$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

test-python:
	PYTHONPATH=$(CURDIR)/$(BUILD_DIR)/python:$(CURDIR)/python $(PYTHON) -m pytest -q tests/python

# ASan+UBSan build and tests, malformed inputs through the CLI, bounded fuzzing (needs clang).
sanitize: deps
	@command -v clang++ >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq clang libclang-rt-dev; }
	bash scripts/ci/sanitize.sh

bench: build
	./$(BUILD_DIR)/bench/sparse_swa_cpu_bench

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD_DIR)
