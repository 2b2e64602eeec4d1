# Ember: the two commands a person needs are `make run` and `make test`.
# Both set everything up first (Debian packages, .venv, the ember package);
# a second run reuses what is already set up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMPS := .stamps
JOBS ?= 2
CORE_SOURCES := $(shell find include src python/src -name '*.h' -o -name '*.cc' -o -name 'CMakeLists.txt') CMakeLists.txt
PYTEST_ARGS ?=

.PHONY: setup run test test-cpp test-asan test-py clean

setup: $(STAMPS)/ember

$(STAMPS)/system: scripts/setup_system.sh
	bash scripts/setup_system.sh
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/venv: requirements.txt $(STAMPS)/system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

# The native module is built by the package build itself (scikit-build-core +
# nanobind); Python sources are live (editable install).
$(STAMPS)/ember: $(STAMPS)/venv pyproject.toml $(CORE_SOURCES)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	@touch $@

# The main job: Fashion-MNIST on 2 nodes, first with the nodes reading TFRecords themselves
# (InputMode.TENSORFLOW), then fed from a Spark DataFrame (InputMode.SPARK).
run: setup
	$(PY) examples/fashion_mnist/main.py
	$(PY) examples/fashion_mnist/train_spark_mode.py

build/core/build.ninja: $(STAMPS)/system
	cmake -S . -B build/core -G Ninja -DEMBER_BUILD_TESTS=ON

build/asan/build.ninja: $(STAMPS)/system
	cmake -S . -B build/asan -G Ninja -DEMBER_BUILD_TESTS=ON -DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug

test-cpp: build/core/build.ninja
	cmake --build build/core -j $(JOBS)
	ctest --test-dir build/core --output-on-failure -j $(JOBS)

test-asan: build/asan/build.ninja
	cmake --build build/asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build/asan --output-on-failure -j $(JOBS)

test-py: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test: setup test-cpp test-asan test-py

clean:
	rm -rf build $(STAMPS)
