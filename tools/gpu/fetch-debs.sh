#!/usr/bin/env bash
# Development machine (Debian 12 with its package registry): downloads the .deb files a GPU machine
# without a package registry needs to build longhaul — gRPC, protobuf, Abseil and the other C++
# libraries; LibTorch comes from the PyTorch wheel already installed there — into .deps/gpu/debs/
# (git-ignored). Carry .deps/gpu to the GPU machine; there `./longhaul.sh build|test|demo` finds
# the folder and installs from it (tools/gpu/offline-setup.sh) instead of asking apt.
# Usage: tools/gpu/fetch-debs.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/.deps/gpu/debs"

# Headers, CMake configs and shared libraries of every C++ dependency except LibTorch and CUDA,
# with the runtime libraries they pull in that Ubuntu 24.04 does not have in the same version; and
# iproute2 (ip, tc: the network namespaces of longhaul-netem and the sweep), which images may lack.
PACKAGES=(
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libc-ares2 libc-ares-dev libre2-9 libre2-dev libupb-dev
  libyaml-cpp-dev libyaml-cpp0.7 libsqlite3-dev libsqlite3-0 nlohmann-json3-dev libcli11-dev
  libboost1.74-dev libboost-filesystem1.74-dev libboost-filesystem1.74.0 libboost-system1.74-dev libboost-system1.74.0
  libsentencepiece-dev libsentencepiece0
  libgtest-dev libgmock-dev googletest libssl-dev libssl3 zlib1g zlib1g-dev libsystemd-dev
  fortunes-min fortunes
  iproute2 libmnl0 libbpf1 libxtables12 libtirpc3 libtirpc-common
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb-dev libcivetweb1 libcurl4-openssl-dev
)
# prometheus-cpp's CMake config checks for all three of its libraries and finds CivetWeb and CURL
# (for the pull and push libraries, which longhaul does not link). libcurl4-openssl-dev gives CURL's
# headers and static library for that check; Debian's libcurl4 is left out on purpose: unpacked
# into the prefix it would shadow the machine's own libcurl.so.4 (on LD_LIBRARY_PATH during the
# build) for cmake itself, with dependencies Ubuntu 24.04 does not have.

command -v apt-get >/dev/null || { echo "fetch-debs: needs apt-get (run it on the Debian 12 development machine)" >&2; exit 1; }
mkdir -p "$OUT"
cd "$OUT"
echo "fetch-debs: downloading ${#PACKAGES[@]} packages into $OUT"
apt-get download "${PACKAGES[@]}" 2> >(grep -v "unsandboxed" >&2) >/dev/null || { echo "fetch-debs: apt-get download failed (is the registry reachable? try apt-get update)" >&2; exit 1; }
echo "fetch-debs: $(ls -1 *.deb | wc -l) files, $(du -sh . | cut -f1); carry .deps/gpu to the GPU machine"
