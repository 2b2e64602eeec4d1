#!/usr/bin/env bash
# Installs the Debian packages Ember's build, tests and example need.
# Idempotent: installs only what is missing.  Needs root (CI and dev machines are).
set -euo pipefail
pkgs=(
  cmake ninja-build g++ make          # build
  libssl-dev                          # HMAC-SHA256 + CSPRNG for the authenticated handshake
  libgtest-dev                        # C++ unit tests
  clang libclang-rt-14-dev            # libFuzzer targets (make fuzz)
  dataset-fashion-mnist               # the main job's data (IDX gzip files)
  libgloo-dev                         # the peer of bench/allreduce.py (Gloo's ring allreduce)
  iproute2                            # ip netns: the two-"host" collective tests
  nftables                            # a client host no executor can dial (python/tests/test_connect_netns.py)
  zlib1g-dev                          # gzip / zlib TFRecord files (src/record)
  libcurl4-openssl-dev                # HTTP client of the WebHDFS file system (src/fs)
  nlohmann-json3-dev                  # WebHDFS's JSON answers (header-only)
  maven                               # fetches Hadoop's minicluster jars for the HDFS tests (make setup-hdfs)
  chromium                            # headless screenshot of TensorBoard's scalars page (python/tests/test_summary.py)
)
command -v java >/dev/null 2>&1 || pkgs+=(openjdk-17-jre-headless)   # Spark 4 needs Java 17
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
