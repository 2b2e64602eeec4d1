#!/usr/bin/env bash
# Run on the dev machine (Debian, network) before a GPU check: downloads into .gpu-debs/ the
# Debian packages the core's build needs that a bare GPU image may lack (the -dev packages of
# OpenSSL, libcurl, zlib and nlohmann-json, their runtime libraries, and libcurl's runtime
# dependencies), so that scripts/gpu_check.sh can unpack them (dpkg -x) on a machine with no
# network.  The compiler's own packages (libc6-dev, linux-libc-dev, ...) are left out: a machine
# that can compile has them.  .gpu-debs/ is git-ignored (.gitignore); carry it to the device:
#   device tool: run(command="bash scripts/gpu_check.sh", carry=[".gpu-debs"])
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu-debs
PKGS=(
  libssl-dev libssl3 libcurl4-openssl-dev libcurl4 zlib1g-dev zlib1g nlohmann-json3-dev
  # libcurl4's runtime dependencies (bookworm), rarely on a CUDA/PyTorch image
  libbrotli1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
  libidn2-0 libunistring2 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libnghttp2-14
  libpsl5 librtmp1 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libffi8 libtasn1-6
  libssh2-1 libzstd1
)
mkdir -p "$DEST"
rm -f "$DEST"/*.deb
(cd "$DEST" && apt-get download "${PKGS[@]}" >/dev/null)
git check-ignore -q "$DEST/x.deb" || echo "/$DEST/" >> "$(git rev-parse --git-path info/exclude)"
total=$(du -sk "$DEST" | cut -f1)
echo "gpu_prepare: $(ls "$DEST"/*.deb | wc -l) packages, $((total / 1024)) MiB in $DEST/ ($(. /etc/os-release && echo "$PRETTY_NAME"))"
if ((total > 30 * 1024)); then
  echo "gpu_prepare: $DEST/ is over 30 MiB; the device tool carries 64 MiB in all" >&2
  exit 1
fi
