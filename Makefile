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
PYTEST_ARGS ?= --durations=25

FUZZERS := codec_fuzz feed_codec_fuzz protocol_fuzz node_startup_fuzz collective_wire_fuzz record_reader_fuzz example_fuzz checkpoint_manifest_fuzz ps_codec_fuzz
FUZZ_SECS ?= 10

.PHONY: setup setup-torch setup-hdfs setup-delta run test test-cpp build-asan build-tsan build-fuzz test-asan test-tsan test-py test-torch fuzz clean cpp-trainer

setup: $(STAMPS)/ember $(STAMPS)/jar

$(STAMPS)/system: scripts/setup_system.sh
	bash scripts/setup_system.sh
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/venv: requirements.txt requirements-nodeps.txt $(STAMPS)/system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	@touch $@

# The native module is built by the package build itself (scikit-build-core +
# nanobind); Python sources are live (editable install).
$(STAMPS)/ember: $(STAMPS)/venv pyproject.toml $(CORE_SOURCES)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	@touch $@

# Ember's Spark extension jar (ember_pack_floats), compiled from python/ember/_scala by the Scala
# compiler pyspark ships, into ~/.cache/ember (EMBER_JAR_DIR): built here so no test waits for it.
$(STAMPS)/jar: $(STAMPS)/ember $(wildcard python/ember/_scala/*.scala)
	$(PY) -c "import ember; print('Ember Spark extension:', ember.spark_jar())"
	@touch $@

# The main job: Fashion-MNIST with Keras model.fit and Ember's synchronous training on 2 nodes,
# first with the nodes reading TFRecords themselves (InputMode.TENSORFLOW; main.py, the
# distributed twin of train_single.py), then fed from a Spark DataFrame (InputMode.SPARK).
run: setup
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) examples/fashion_mnist/main.py
	$(PY) examples/fashion_mnist/train_spark_mode.py

build/core/build.ninja: $(STAMPS)/system
	cmake -S . -B build/core -G Ninja -DEMBER_BUILD_TESTS=ON

# The sanitizer builds compile the core's layers in unity batches (CMakeLists.txt, EMBER_UNITY_BUILD),
# as the package build does; build/core compiles every file alone.
# The sanitizer builds carry line tables only (-g1): their reports name file:line all the same, and
# they compile ~15-20% faster than with full debug info (CI's time).  ctest runs each gtest binary
# in 4 shards (src/CMakeLists.txt, EMBER_TEST_SHARDS); a failing shard prints which test failed,
# and `build/asan/src/<binary> --gtest_filter=...` reruns it alone.
build/asan/build.ninja: $(STAMPS)/system
	cmake -S . -B build/asan -G Ninja -DEMBER_BUILD_TESTS=ON -DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DEMBER_TEST_SHARDS=4 -DEMBER_UNITY_BUILD=ON

test-cpp: build/core/build.ninja setup-hdfs
	cmake --build build/core -j $(JOBS)
	ctest --test-dir build/core --output-on-failure -j $(JOBS)

build-asan: build/asan/build.ninja
	cmake --build build/asan -j $(JOBS)

test-asan: build-asan setup-hdfs
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build/asan --output-on-failure -j $(JOBS)

# ThreadSanitizer build of the gtests, compiled with clang so the same build also checks the
# thread-safety annotations (-Wthread-safety as errors: GUARDED_BY needs ember::Mutex, common/mutex.h).
build/tsan/build.ninja: $(STAMPS)/system
	cmake -S . -B build/tsan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DEMBER_BUILD_TESTS=ON -DEMBER_TSAN=ON \
	  -DEMBER_THREAD_SAFETY_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
	  -DEMBER_TEST_SHARDS=4 -DEMBER_UNITY_BUILD=ON

build-tsan: build/tsan/build.ninja
	cmake --build build/tsan -j $(JOBS)

test-tsan: build-tsan setup-hdfs
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir build/tsan --output-on-failure -j $(JOBS)

# libFuzzer targets for the parsers of untrusted bytes (clang); each runs FUZZ_SECS seconds
# on its corpus in build/fuzz/corpus/, so the targets build and stay clean.  Crashes land in build/fuzz/.
build/fuzz/build.ninja: $(STAMPS)/system
	cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_FUZZERS=ON

# The targets run $(JOBS) at a time (each is one process on one core); a failing one fails the
# target, and its lines, prefixed with its name, say which.
build-fuzz: build/fuzz/build.ninja
	cmake --build build/fuzz -j $(JOBS) --target $(FUZZERS)

fuzz: build-fuzz
	printf '%s\n' $(FUZZERS) | xargs -P $(JOBS) -I{} bash -c '\
	  mkdir -p build/fuzz/corpus/{} && \
	  build/fuzz/src/{} -max_total_time=$(FUZZ_SECS) -print_final_stats=1 -artifact_prefix=build/fuzz/{}- \
	    build/fuzz/corpus/{} 2>&1 | grep -E "^(Done|stat::number_of_executed_units)|ERROR|SUMMARY" | sed "s/^/{}: /"; \
	  test $${PIPESTATUS[0]} -eq 0'

# The C++ node example (examples/cpp_trainer): build/cpp_trainer/cpp_trainer, linking the core and
# Arrow C++ from the venv's pyarrow wheel.  Its pytest (test_cpp_trainer.py) calls this target.
# It is a target of the package's own build (build/py, EMBER_BUILD_EXAMPLES), which has the core
# built already: only the example's three files compile.
cpp-trainer: setup
	cmake build/py -DEMBER_BUILD_EXAMPLES=ON -DPython3_EXECUTABLE=$(abspath $(PY)) > /dev/null
	cmake --build build/py -j $(JOBS) --target cpp_trainer
	mkdir -p build/cpp_trainer
	cmake -E copy_if_different build/py/examples/cpp_trainer/cpp_trainer build/cpp_trainer/cpp_trainer

# python/tests_spark_ext runs in a pytest process (and so a Spark JVM) of its own: its sessions load
# Ember's Spark extension, which only a session that starts the JVM can (and TorchModel's packed
# path there needs .torch-site).
test-py: setup setup-hdfs setup-delta setup-torch
	$(PY) -m pytest $(PYTEST_ARGS)
	$(PY) -m pytest python/tests_spark_ext

# The gtests run under both sanitizers (ASan+UBSan: a Debug build; TSan: clang, optimized); the plain
# optimized build of them (`make test-cpp`) is left out of `make test`, which must stay under CI's
# time on 2 cores: each build of the core takes minutes there.
#
# Its first step runs the set-up and the ASan build side by side: the package installs (the venv,
# torch) keep one core busy unzipping wheels, the compiler the other (681 s against 724 s one after
# the other, on a slower host); each step's output is printed whole when it ends.  The C++ node
# example (cpp-trainer, for test_cpp_trainer.py) is built there too, after the package.
#
# The TSan and fuzz builds then compile beside the Python tests, at idle priority (SCHED_IDLE:
# they get only the CPU the tests leave, so the tests' timing is what it was; nice 19 where
# chrt may not set it).  The Python tests
# leave a fifth of the two cores idle (Spark's and the nodes' waits: ~800 core-seconds measured
# over python/tests); the two builds need ~400.  Their log is printed after the tests; every test
# (gtests under TSan, fuzz runs) still runs at normal priority, one step at a time.
test:
	$(MAKE) --no-print-directory -j 2 --output-sync=target setup setup-torch setup-hdfs setup-delta build-asan cpp-trainer
	$(MAKE) --no-print-directory test-asan
	@mkdir -p build; \
	  idle="chrt --idle 0"; $$idle true 2>/dev/null || idle="nice -n 19"; \
	  $$idle $(MAKE) --no-print-directory build-tsan build-fuzz > build/idle-builds.log 2>&1 & builds=$$!; \
	  $(MAKE) --no-print-directory test-py; tests=$$?; \
	  wait $$builds; built=$$?; \
	  echo "--- make build-tsan build-fuzz, beside the Python tests at idle priority (exit $$built):"; \
	  cat build/idle-builds.log; \
	  test $$tests -eq 0 && test $$built -eq 0
	$(MAKE) --no-print-directory test-tsan fuzz test-torch

# Real PyTorch for python/tests_torch (DataFeed.to_torch_dataset, ember.torch's synchronous
# training, unchanged torch.distributed programs) and the torch contenders of bench/.  PyPI has
# no CPU-only torch, so its wheel brings ~5 GB of CUDA libraries (~2 min to install here); they
# go into .torch-site/ once, not into the venv (torch pulls a setuptools without the
# pkg_resources TFoS 2.2.5, a bench peer, imports).  Tests put it on the path themselves.
TORCH_VERSION := 2.15.0
.torch-site/.installed: $(STAMPS)/venv
	$(PY) -m pip install -q --disable-pip-version-check --target .torch-site torch==$(TORCH_VERSION)
	@touch $@

setup-torch: .torch-site/.installed

test-torch: setup setup-torch
	$(PY) -m pytest python/tests_torch

# A real HDFS for the tests (python/tests/hdfs_cluster.py runs a NameNode + DataNode on loopback):
# Hadoop's hadoop-minicluster 3.4.1 and its dependency closure (scripts/hdfs/pom.xml, ~110 MB)
# copied from Maven Central into .hdfs/lib once.
.hdfs/.installed: scripts/hdfs/pom.xml $(STAMPS)/system
	rm -rf .hdfs/lib
	mvn -q -B -f scripts/hdfs/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath .hdfs/lib)
	@touch $@

setup-hdfs: .hdfs/.installed

# Delta Lake's Spark connector for the tests that write real Delta tables (scripts/delta/pom.xml):
# delta-spark and delta-storage, ~8 MB, copied from Maven Central into .delta/lib once (the rest
# of their closure is Spark's own).
.delta/.installed: scripts/delta/pom.xml $(STAMPS)/system
	rm -rf .delta/lib
	mvn -q -B -f scripts/delta/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DexcludeArtifactIds=antlr4-runtime,scala-library -DoutputDirectory=$(abspath .delta/lib)
	@touch $@

setup-delta: .delta/.installed

clean:
	rm -rf build $(STAMPS)
