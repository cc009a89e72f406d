# SPDX-License-Identifier: Apache-2.0
# Thin wrappers over CMake. `make demo` and `make test` work on a fresh Debian machine: they
# install the missing Debian packages (apt-get) first, and `make test` the Python packages (pip)
# into a project virtual environment, .venv/ (Debian's own Python refuses pip installs outside
# one). PYTHON=/path/to/python uses that interpreter as it is, without the virtual environment.
BUILD_DIR ?= build
DEMO_BUILD_DIR ?= build-demo
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)
VENV ?= .venv
SYSTEM_PYTHON ?= python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(VENV)/bin/python
PYTHON_DEPS := $(PYTHON)
else
PYTHON_DEPS :=
endif

# What `make demo` needs (the CLI alone, CPU only), then what the tests, benchmarks and the
# Python module add.
DEMO_DEB_PACKAGES := cmake g++ make nlohmann-json3-dev libcli11-dev
DEB_PACKAGES := $(DEMO_DEB_PACKAGES) libgtest-dev libgmock-dev libbenchmark-dev python3-dev \
                python3-venv python3-pip
PY_PACKAGES := numpy pytest nanobind scikit-build-core hypothesis

.PHONY: all deps deps-demo build demo test test-cpp test-python sanitize bench clean format

all: build

# apt-get install of the packages of $(1) that are missing.
define install_debian_packages
	@missing=""; for p in $(1); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
endef

deps-demo:
	$(call install_debian_packages,$(DEMO_DEB_PACKAGES))

deps: $(PYTHON_DEPS)
	$(call install_debian_packages,$(DEB_PACKAGES))
	@$(PYTHON) -c "import numpy, pytest, nanobind, scikit_build_core, hypothesis" 2>/dev/null || \
	  $(PYTHON) -m pip install -q $(PY_PACKAGES)

# The project virtual environment. It sees the system's site-packages, so Python packages that
# are already installed (pip or apt) are used, not downloaded again.
$(VENV)/bin/python:
	$(call install_debian_packages,python3-venv python3-pip)
	$(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSE_SWA_TESTS=ON \
	  -DSPARSE_SWA_BENCH=ON -DSPARSE_SWA_CLI=ON -DSPARSE_SWA_PYTHON=ON \
	  -DPython_EXECUTABLE=$$($(PYTHON) -c 'import sys; print(sys.executable)') $(CMAKE_ARGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The CLI alone, CPU only, in its own build folder: no tests, benchmarks, Python or CUDA.
demo: deps-demo
	cmake -S . -B $(DEMO_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DSPARSE_SWA_CUDA=OFF \
	  -DSPARSE_SWA_CLI=ON -DSPARSE_SWA_TESTS=OFF -DSPARSE_SWA_BENCH=OFF -DSPARSE_SWA_PYTHON=OFF \
	  $(CMAKE_ARGS)
	cmake --build $(DEMO_BUILD_DIR) -j $(JOBS) --target sparse-swa
	./$(DEMO_BUILD_DIR)/sparse-swa demo

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
	rm -rf $(BUILD_DIR) $(DEMO_BUILD_DIR)
