#!/usr/bin/env bash
# Builds Debian's own gRPC (the source of the installed libgrpc++-dev, Debian's patches applied)
# with NDEBUG into /usr/local/lib/ckpt-grpc, for the project's `-c opt` builds
# (third_party/system.BUILD); idempotent: nothing is done when that directory holds the build of
# the installed version. Called by tools/install_deps.sh.
#
# Why: Debian builds gRPC with CMAKE_BUILD_TYPE=None, so its libraries keep their debug checks.
# One of them walks every tag outstanding on a completion queue at each completion
# (cq_check_tag): with 12,800 WatchWork streams held, the coordinator paid 80-92 us of CPU per
# unary call for it (docs/BENCHMARKS.md, issue 16, sessions 15 and 18). Headers stay Debian's
# (the same source): only the libraries are swapped, all of them together, since libgrpc++
# uses libgrpc internals whose layout depends on NDEBUG. Each library's RUNPATH names this
# directory, so the release libraries load each other and never Debian's. Debian's
# libgrpc++_reflection (generated service code over grpc++'s public API; it needs protoc's
# library to build) stays and binds to the release libgrpc++ already loaded.
#
# Needs deb-src entries for Debian's archive: when none is configured, one is added beside the
# machine's deb entries (/etc/apt/sources.list.d/ckpt-deb-src.sources) and the lists updated;
# apt-get source checks the download against the signed Sources index.
set -euo pipefail

USAGE="usage: tools/install_grpc_release.sh
Builds the installed gRPC version's Debian source with NDEBUG into /usr/local/lib/ckpt-grpc
(once per version), for -c opt builds; tools/install_deps.sh runs it. Takes no arguments."
if [[ $# -gt 0 ]]; then
  if [[ $# -eq 1 && ( $1 == --help || $1 == -h ) ]]; then
    echo "$USAGE"
    exit 0
  fi
  echo "install_grpc_release: unexpected argument '$1'" >&2
  echo "$USAGE" >&2
  exit 2
fi

DEST=/usr/local/lib/ckpt-grpc
LIBS=(gpr grpc grpc++ upb address_sorting)
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

# The source version (a binary rebuild such as 1.51.1-3+b1 comes from source 1.51.1-3).
version=$(dpkg-query -W -f='${source:Version}' libgrpc++-dev)
if [[ "$(cat "$DEST/.ckpt-grpc-version" 2>/dev/null)" == "$version" ]]; then
  echo "install_grpc_release: gRPC $version built with NDEBUG present in $DEST"
  exit 0
fi

if ! grep -rqs '^\(Types: *\)\?deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed 's/^Types: *deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      $SUDO tee /etc/apt/sources.list.d/ckpt-deb-src.sources >/dev/null
  else
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' |
      $SUDO tee /etc/apt/sources.list.d/ckpt-deb-src.list >/dev/null
  fi
  echo "install_grpc_release: added deb-src entries for Debian's archive; updating the lists"
  $SUDO apt-get update -qq
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-grpc-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "install_grpc_release: building gRPC $version with NDEBUG (a few minutes, once per version)"
apt-get source -qq "grpc=$version" >apt-source.log 2>&1 || {
  echo "install_grpc_release: apt-get source grpc=$version failed:" >&2
  cat apt-source.log >&2
  exit 1
}
src=$(find . -maxdepth 1 -type d -name 'grpc-*' | head -1)
mkdir build
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH="$DEST" \
  -DgRPC_BUILD_TESTS=OFF -DgRPC_BUILD_CODEGEN=OFF -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF \
  -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
  -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
  -DgRPC_BENCHMARK_PROVIDER=none >cmake.log 2>&1 || {
  echo "install_grpc_release: cmake failed (log below)" >&2
  tail -40 cmake.log >&2
  exit 1
}
make -C build -j"$(nproc)" grpc++ >make.log 2>&1 || {
  echo "install_grpc_release: the build failed (log below)" >&2
  tail -40 make.log >&2
  exit 1
}
# Assembled beside the destination and renamed into place: a half-copied set (a release libgrpc++
# beside Debian's libgrpc) would crash whatever loads it.
$SUDO rm -rf "$DEST.new"
$SUDO mkdir -p "$DEST.new"
for lib in "${LIBS[@]}"; do
  $SUDO cp -a build/lib"$lib".so* "$DEST.new"/
done
echo "$version" | $SUDO tee "$DEST.new/.ckpt-grpc-version" >/dev/null
$SUDO rm -rf "$DEST"
$SUDO mv "$DEST.new" "$DEST"
echo "install_grpc_release: gRPC $version built with NDEBUG installed in $DEST"
