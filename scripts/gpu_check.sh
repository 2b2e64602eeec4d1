#!/usr/bin/env bash
# The GPU checks of issue 20, as one script for a lent GPU machine (no network there).
#
# How a session with a GPU machine runs it (the device tool):
#   1. here, on the dev machine:  bash scripts/gpu_prepare.sh
#      (downloads the Debian -dev packages the core's build needs into .gpu-debs/, ~12 MiB,
#      git-ignored; used on the device only where its system lacks them)
#   2. on the device:  run(command="bash scripts/gpu_check.sh", carry=[".gpu-debs"], timeout_s=600)
#   The summary is the end of the output and $OUT/gpu_check.txt; logs of each step are in $OUT.
#
# Steps, each with a timeout, under one deadline (GPU_CHECK_SECS, default 560 s: under 10 minutes):
#   machine      nvidia-smi, driver, python3, torch and whether it sees CUDA
#   build-needs  cmake >= 3.25, ninja, a C++20 compiler, Python headers, nanobind,
#                scikit-build-core, OpenSSL / libcurl / zlib / nlohmann-json headers (from the
#                system, else from .gpu-debs/*.deb unpacked with dpkg -x into /tmp/gpudeps)
#   build        Ember's Python module for that python3, pip --target /tmp/ember-site (no network)
#   tests_gpu    python3 -m pytest python/tests_gpu
#   bench        bench/gpu_allreduce.py (CUDA tensors, 2 ranks, 1-128 MB fp32/bf16)
#   bench_training bench/gpu_training.py (DistributedOptimizer fused/overlap vs DDP-gloo, 2 ranks
#                on one GPU, the CNN and ResNet-50)
#   bench_feed   bench/gpu_feed.py (batches to the GPU through pinned memory vs the bare pinned
#                copy; the CNN fed from host memory vs on batches already on the GPU)
#   bench_cpu    bench/allreduce.py on the host's cores: Ember's shared-memory allreduce of CPU
#                buffers (threads per rank, and one thread) vs torch.distributed gloo, 2/4/8 ranks
#                (the big-host goal); builds bench/collective's harness (cmake, ninja)
# Each step says OK, FAILED or NOT RUN with the reason and how to bring what is missing.
#
# Options: --no-build  checks the build's needs but builds nothing (a dev machine: the core is not
#                      built there; the module must then already import, e.g. PYTHONPATH=python)
#          --quick     the benchmark's --quick sizes
#          --steps a,b  only these of tests_gpu,bench,bench_feed,bench_training,bench_cpu (default all)
# Environment: PYTHON (the interpreter; default: the first of /opt/torch/.venv/bin/python3 and
#              python3 that imports torch), OUT (where the summary and logs go), JOBS (build jobs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_SECS:-560}))
NO_BUILD=0; QUICK=0; STEPS=tests_gpu,bench,bench_feed,bench_training,bench_cpu
while (($#)); do
  case "$1" in
    --no-build) NO_BUILD=1 ;;
    --quick) QUICK=1 ;;
    --steps) STEPS=${2:-}; shift ;;
    *) echo "gpu_check: unknown option $1 (--no-build, --quick, --steps a,b)" >&2; exit 2 ;;
  esac
  shift
done
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }
LOGS=${OUT:-/tmp/gpu-check-logs}
mkdir -p "$LOGS"
SUMMARY=()
FAILED=0
note() { SUMMARY+=("$(printf '%-12s %-8s %s' "$1" "$2" "$3")"); [ "$2" = FAILED ] && FAILED=1; echo "== $1: $2 $3"; }
left() { echo $((DEADLINE - $(date +%s))); }
# step_timeout MAX: MAX seconds, or what is left before the deadline if less
step_timeout() { local l; l=$(left); ((l < $1)) && echo $((l > 5 ? l : 5)) || echo "$1"; }

# ----------------------------------------------------------------------------- machine
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in /opt/torch/.venv/bin/python3 python3; do
    if command -v "$c" >/dev/null && timeout 60 "$c" -c "import torch" 2>/dev/null; then PY=$c; break; fi
  done
  PY=${PY:-python3}
fi
echo "== machine"
GPU=""; HAVE_GPU=0
if command -v nvidia-smi >/dev/null; then
  timeout 30 nvidia-smi -L 2>&1 | tee "$LOGS/nvidia-smi.txt"
  GPU=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
  echo "$GPU"
else
  GPU="no nvidia-smi on PATH"
fi
TORCH=$(timeout 90 "$PY" - 2>&1 <<'EOF'
import platform
try:
    import torch
    ok = torch.cuda.is_available()
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"cuda available: {ok}" + (f", {torch.cuda.get_device_name(0)}" if ok else ""))
except Exception as e:
    print(f"python {platform.python_version()}, torch does not import: {e}")
EOF
)
echo "$PY: $TORCH"
[[ "$TORCH" == *"cuda available: True"* ]] && HAVE_GPU=1
if ((HAVE_GPU)); then
  note machine OK "$GPU; $PY: $TORCH"
else
  note machine "NO GPU" "$GPU; $PY: $TORCH"
fi

# ----------------------------------------------------------------------------- build-needs
echo "== build-needs"
PREFIX=/tmp/gpudeps
MISSING=(); FROM_DEBS=""
INCLUDES=(/usr/include /usr/include/x86_64-linux-gnu /usr/local/include)
have_header() { local d; for d in "${INCLUDES[@]}"; do [ -e "$d/$1" ] && return 0; done; return 1; }
# system libraries: header (or pkg-config module) present
check_system_libs() {
  MISSING_LIBS=()
  local pair mod hdr
  for pair in openssl:openssl/ssl.h libcurl:curl/curl.h zlib:zlib.h nlohmann_json:nlohmann/json.hpp; do
    mod=${pair%%:*}; hdr=${pair#*:}
    if have_header "$hdr"; then continue; fi
    if command -v pkg-config >/dev/null && pkg-config --exists "$mod" 2>/dev/null && [ "$mod" != nlohmann_json ]; then
      local inc; inc=$(pkg-config --variable=includedir "$mod")
      [ -e "$inc/$hdr" ] && continue
    fi
    MISSING_LIBS+=("$mod ($hdr)")
  done
}
use_debs() {  # unpacks .gpu-debs/*.deb into $PREFIX and points the build at it
  rm -rf "$PREFIX"; mkdir -p "$PREFIX/rt"
  local deb
  for deb in .gpu-debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$PREFIX" || return 1
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      (t=$(mktemp -d) && cd "$t" && ar x "$REPO/$deb" && tar -xf data.tar.* -C "$PREFIX" && rm -rf "$t") || return 1
    fi
  done
  local libdir=$PREFIX/usr/lib/x86_64-linux-gnu
  sed -i "s#^prefix=/usr#prefix=$PREFIX/usr#" "$libdir"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc 2>/dev/null
  # runtime: only the libraries whose soname the system lacks go on LD_LIBRARY_PATH
  local so name
  for so in "$libdir"/lib*.so.*; do
    name=$(basename "$so")
    [[ "$name" =~ \.so\.[0-9]+$ ]] || continue  # sonames only (libcurl.so.4, not libcurl.so.4.8.0)
    ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$name " || ln -sf "$so" "$PREFIX/rt/$name"
  done
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$libdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$libdir/pkgconfig:$PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LDFLAGS="-Wl,-rpath-link,$libdir ${LDFLAGS:-}"
  export LD_LIBRARY_PATH="$PREFIX/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  INCLUDES+=("$PREFIX/usr/include" "$PREFIX/usr/include/x86_64-linux-gnu")
}
# tools (the venv's cmake / ninja wheels count: the interpreter's bin/ goes first on PATH)
export PATH="$(dirname "$PY"):$PATH"
if command -v cmake >/dev/null; then
  CMV=$(cmake --version | head -1 | awk '{print $3}')
  [ "$(printf '%s\n3.25\n' "$CMV" | sort -V | head -1)" = 3.25 ] || MISSING+=("cmake >= 3.25 (have $CMV; pip install cmake)")
  echo "cmake $CMV"
else
  MISSING+=("cmake (pip install cmake, or apt-get install cmake)")
fi
command -v ninja >/dev/null && echo "ninja $(ninja --version)" || MISSING+=("ninja (pip install ninja, or apt-get install ninja-build)")
CXX=${CXX:-$(command -v c++ || command -v g++ || command -v clang++ || true)}
if [ -z "$CXX" ]; then
  MISSING+=("a C++ compiler (apt-get install g++)")
else
  tmpd=$(mktemp -d)
  printf '#include <span>\n#include <concepts>\nint main(){ std::span<int> s; return static_cast<int>(s.size()); }\n' > "$tmpd/t.cc"
  if timeout 60 "$CXX" -std=c++20 -o "$tmpd/t" "$tmpd/t.cc" 2>"$tmpd/err"; then
    echo "C++20: $CXX ($("$CXX" --version | head -1))"
  else
    MISSING+=("a C++20 compiler ($CXX fails on -std=c++20: $(head -c 200 "$tmpd/err"))")
  fi
  rm -rf "$tmpd"
fi
PYINFO=$(timeout 60 "$PY" - 2>&1 <<'EOF'
import os, sysconfig
inc = sysconfig.get_paths()["include"]
print("headers " + ("ok " if os.path.exists(os.path.join(inc, "Python.h")) else "MISSING ") + inc)
for mod in ("nanobind", "scikit_build_core", "pytest", "numpy", "pyarrow"):
    try:
        m = __import__(mod)
        print(f"{mod} ok {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{mod} MISSING {e}")
EOF
)
echo "$PYINFO"
while read -r what status rest; do
  [ "$status" = MISSING ] || continue
  case "$what" in
    headers) MISSING+=("Python headers, no Python.h in $rest (python3-dev, or a Python built with them)") ;;
    scikit_build_core) MISSING+=("scikit-build-core for $PY (pip install scikit-build-core)") ;;
    *) MISSING+=("$what for $PY (pip install $what)") ;;
  esac
done <<< "$PYINFO"
check_system_libs
# GPU_CHECK_FORCE_DEBS=1: use .gpu-debs even where the system has the libraries (tests the path)
[ "${GPU_CHECK_FORCE_DEBS:-0}" = 1 ] && ((${#MISSING_LIBS[@]} == 0)) && MISSING_LIBS=("(forced: GPU_CHECK_FORCE_DEBS=1)")
if ((${#MISSING_LIBS[@]})); then
  echo "the system lacks: ${MISSING_LIBS[*]}"
  if compgen -G ".gpu-debs/*.deb" >/dev/null; then
    if use_debs; then
      FROM_DEBS="from .gpu-debs ($(ls .gpu-debs/*.deb | wc -l) packages unpacked into $PREFIX): ${MISSING_LIBS[*]}"
      echo "$FROM_DEBS"
      check_system_libs
    fi
  fi
  for m in "${MISSING_LIBS[@]}"; do
    MISSING+=("$m: run scripts/gpu_prepare.sh on the dev machine and carry .gpu-debs (or apt-get install libssl-dev libcurl4-openssl-dev zlib1g-dev nlohmann-json3-dev)")
  done
fi
if ((${#MISSING[@]})); then
  note build-needs FAILED "missing: $(printf '%s; ' "${MISSING[@]}")"
else
  note build-needs OK "cmake, ninja, C++20, Python headers, nanobind, scikit-build-core, openssl/libcurl/zlib/nlohmann-json${FROM_DEBS:+ ($FROM_DEBS)}"
fi

# ----------------------------------------------------------------------------- build
SITE=/tmp/ember-site
if ((NO_BUILD)); then
  note build "NOT RUN" "--no-build (ember is imported as PYTHONPATH finds it)"
  SITE=""
elif ((${#MISSING[@]})); then
  note build "NOT RUN" "build needs missing (above)"
  SITE=""
else
  echo "== build (pip --target $SITE, build dir /tmp/ember-build)"
  rm -rf "$SITE"
  t0=$(date +%s)
  export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
  if SKBUILD_BUILD_DIR=/tmp/ember-build timeout -k 10 "$(step_timeout 300)" \
       "$PY" -m pip install --no-build-isolation --no-deps --no-index --disable-pip-version-check \
       --target "$SITE" . >"$LOGS/build.log" 2>&1 \
     && PYTHONPATH=$SITE timeout 60 "$PY" -c "from ember import _ember" >>"$LOGS/build.log" 2>&1; then
    so=$(ls "$SITE"/ember/_ember*.so 2>/dev/null | head -1)
    # the GPU image's g++ links libstdc++ statically: say so (python/src/CMakeLists.txt keeps it inside)
    libcxx=$(ldd "$so" 2>/dev/null | grep -q 'libstdc++' && echo "libstdc++ shared" || echo "libstdc++ static")
    note build OK "$SITE ($(( $(date +%s) - t0 )) s, $(basename "$so"), $libcxx, $CXX)"
  else
    rc=$?
    tail -40 "$LOGS/build.log"
    note build FAILED "rc $rc after $(( $(date +%s) - t0 )) s (124: timed out); last lines above, whole log in $LOGS/build.log"
    SITE=""
  fi
fi
if [ -n "$SITE" ]; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
EMBER_OK=0
if timeout 60 "$PY" -c "from ember import _ember" 2>"$LOGS/import.log"; then
  EMBER_OK=1
  RT=$(timeout 60 "$PY" -c "import torch; torch.cuda.init(); from ember import _ember; print(_ember.cuda_runtime())" 2>&1 | tail -1)
  echo "ember: $(timeout 60 "$PY" -c "import ember, os; print(os.path.dirname(ember.__file__))" 2>&1); $RT"
fi

# ----------------------------------------------------------------------------- tests_gpu, bench
if ((!HAVE_GPU)); then
  note tests_gpu "NOT RUN" "no GPU (torch.cuda.is_available() is False)"
  note bench "NOT RUN" "no GPU"
  note bench_feed "NOT RUN" "no GPU"
  note bench_training "NOT RUN" "no GPU"
elif ((!EMBER_OK)); then
  note tests_gpu "NOT RUN" "ember._ember does not import: $(tail -1 "$LOGS/import.log")"
  note bench "NOT RUN" "ember._ember does not import"
  note bench_feed "NOT RUN" "ember._ember does not import"
  note bench_training "NOT RUN" "ember._ember does not import"
else
  if wanted tests_gpu; then
  echo "== tests_gpu"
  timeout -k 10 "$(step_timeout 150)" "$PY" -m pytest python/tests_gpu -q -p no:cacheprovider --timeout 120 \
    2>&1 | tee "$LOGS/tests_gpu.log"
  rc=${PIPESTATUS[0]}
  last=$(grep -E "passed|failed|error" "$LOGS/tests_gpu.log" | tail -1)
  if ((rc == 0)); then note tests_gpu OK "$last"
  else note tests_gpu FAILED "rc $rc (124: timed out): ${last:-no summary}; log in $LOGS/tests_gpu.log"; fi
  fi
  if wanted bench; then
  echo "== bench"
  T=$(step_timeout 150)
  timeout -k 10 "$T" "$PY" bench/gpu_allreduce.py --device cuda --timeout $((T - 15)) \
    $( ((QUICK)) && echo --quick) --json "$LOGS/gpu_allreduce.json" 2>&1 | tee "$LOGS/bench.log"
  rc=${PIPESTATUS[0]}
  last=$(grep "^gpu_allreduce_min_ratio" "$LOGS/bench.log" | tail -1)
  if ((rc == 0)) && [ -n "$last" ]; then note bench OK "$last; $(grep '^goal' "$LOGS/bench.log")"
  else note bench FAILED "rc $rc (124: timed out): $(tail -1 "$LOGS/bench.log")"; fi
  fi
  if wanted bench_feed; then
  echo "== bench_feed"
  timeout -k 10 "$(step_timeout 90)" "$PY" bench/gpu_feed.py --device cuda $( ((QUICK)) && echo --quick) \
    --json "$LOGS/gpu_feed.json" 2>&1 | tee "$LOGS/bench_feed.log"
  rc=${PIPESTATUS[0]}
  last=$(grep "^gpu_feed_ratio" "$LOGS/bench_feed.log" | tail -1)
  if ((rc == 0)) && [ -n "$last" ]; then note bench_feed OK "$last; $(grep '^goal' "$LOGS/bench_feed.log")"
  else note bench_feed FAILED "rc $rc (124: timed out): $(tail -1 "$LOGS/bench_feed.log")"; fi
  fi
  if wanted bench_training; then
  echo "== bench_training"
  T=$(step_timeout 150)
  timeout -k 10 "$T" "$PY" bench/gpu_training.py --device cuda --timeout $((T - 15)) $( ((QUICK)) && echo --quick) \
    --json "$LOGS/gpu_training.json" 2>&1 | tee "$LOGS/bench_training.log"
  rc=${PIPESTATUS[0]}
  last=$(grep "^gpu_training" "$LOGS/bench_training.log" | tail -1)
  if ((rc == 0)) && [ -n "$last" ]; then note bench_training OK "$last"
  else note bench_training FAILED "rc $rc (124: timed out): $(tail -1 "$LOGS/bench_training.log")"; fi
  fi
fi

# ----------------------------------------------------------------------------- bench_cpu
# CPU buffers only: runs with or without a GPU, but needs the build's needs and torch.
if wanted bench_cpu; then
  if ((${#MISSING[@]})); then
    note bench_cpu "NOT RUN" "build needs missing (above)"
  else
    echo "== bench_cpu (bench/allreduce.py, $(nproc) cores)"
    T=$(step_timeout 240)
    timeout -k 10 "$T" "$PY" bench/allreduce.py --ranks "${CPU_RANKS:-2,4,8}" --sizes "${CPU_SIZES:-64K,1M,16M,64M}" \
      --repeats "${CPU_REPEATS:-3}" --gloo-variants "" --no-tcp --one-thread --json "$LOGS/allreduce_cpu.json" \
      2>&1 | tee "$LOGS/bench_cpu.log"
    rc=${PIPESTATUS[0]}
    last=$(grep "^allreduce_busbw" "$LOGS/bench_cpu.log" | tail -1)
    if ((rc == 0)) && [ -n "$last" ]; then
      note bench_cpu OK "$last; $(grep -E '^ +\[[0-9] ranks\] (goal|threads)' "$LOGS/bench_cpu.log" | sed 's/^ *//' | tr '\n' ';')"
    else note bench_cpu FAILED "rc $rc (124: timed out): $(tail -1 "$LOGS/bench_cpu.log")"; fi
  fi
fi

# ----------------------------------------------------------------------------- summary
{
  echo
  echo "== gpu_check summary: $(hostname), $(date -Is), $(( $(date +%s) - START )) s"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$LOGS/gpu_check.txt"
exit $FAILED
