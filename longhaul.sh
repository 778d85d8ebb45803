#!/usr/bin/env bash
# longhaul's two entry points (README quick start):
#   ./longhaul.sh demo [options]   run the main job: a local coordinator + 4 workers training a small
#                                  GPT over gRPC with compressed, rate-limited links (tools/demo.sh)
#   ./longhaul.sh test [ctest args] build and run the whole test suite; non-zero exit on any failure
# Both install missing Debian packages on first use (tools/setup.sh; on a machine without a package
# registry, from the .deb files carried in .deps/gpu: tools/gpu/offline-setup.sh) and build
# incrementally into build/ (executables in build/bin/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$ROOT/build"
STAMP="$BUILD/.setup-ok"

usage() {
  cat <<'USAGE'
usage: ./longhaul.sh <command> [args]

commands:
  demo [options]      build, then start a coordinator and 4 worker processes on this machine and
                      train a small GPT over gRPC (TAH-Quant forward / INT8 backward, 100 Mbit/s
                      links) with a live progress bar and a summary; options: --steps N,
                      --summary-json PATH, --rate-mbit R, --replicas N (2 stages x N workers,
                      data parallelism inside each stage; or a count per stage, 2,1), ...
                      (./longhaul.sh demo --help)
  test [ctest args]   build and run the whole CTest suite (e.g. ./longhaul.sh test -L codec)
  build [TARGET...]   install what is missing and build (everything, or only these CMake targets)
  help                this text

environment: LONGHAUL_JOBS (build parallelism, default: nproc), LONGHAUL_BUILD_TYPE (RelWithDebInfo),
LONGHAUL_OFFLINE (1: install from .deps/gpu's .deb files, 0: with apt; default: offline where those
files exist on a machine that is not Debian 12 and lacks the packages; docs/gpu.md)
USAGE
}

OFFLINE_DEBS="$ROOT/.deps/gpu/debs"
OFFLINE_PREFIX="$ROOT/.deps/gpu-prefix"
# A machine without a package registry (the offline GPU machine, docs/gpu.md) carries the .deb
# files fetched by tools/gpu/fetch-debs.sh; they are unpacked into a prefix instead of installed.
# The development machine that fetched them (Debian 12, with its registry) installs the packages
# with tools/setup.sh instead, whether or not it has yet. LONGHAUL_OFFLINE=1 or 0 decides instead
# (a Debian 12 machine without a registry: 1).
offline() {
  [[ -n "${LONGHAUL_OFFLINE:-}" ]] && { [[ "$LONGHAUL_OFFLINE" == 1 ]]; return; }
  compgen -G "$OFFLINE_DEBS/*.deb" >/dev/null &&
    [[ "$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")" != bookworm ]] &&
    [[ "$(dpkg-query -W -f='${Status}' libgrpc++-dev 2>/dev/null)" != "install ok installed" ]]
}

setup() {
  if offline; then
    bash "$ROOT/tools/gpu/offline-setup.sh"
    export LD_LIBRARY_PATH="$OFFLINE_PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    local ninja_dir
    ninja_dir="$(python3 -c 'import ninja, os; print(os.path.join(os.path.dirname(ninja.__file__), "data", "bin"))' 2>/dev/null || true)"
    [[ -n "$ninja_dir" ]] && export PATH="$PATH:$ninja_dir"
    return
  fi
  # The setup script is idempotent; skip even its dpkg query when it succeeded for this script.
  if [[ ! -f "$STAMP" || "$ROOT/tools/setup.sh" -nt "$STAMP" ]]; then
    bash "$ROOT/tools/setup.sh"
    mkdir -p "$BUILD"
    touch "$STAMP"
  fi
}

build() {
  setup
  local jobs="${LONGHAUL_JOBS:-$(nproc)}"
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    local extra=()
    if offline; then
      local lib="$OFFLINE_PREFIX/usr/lib/x86_64-linux-gnu"
      extra=(-DCMAKE_PREFIX_PATH="$lib/cmake;$OFFLINE_PREFIX/usr"
             -DProtobuf_PROTOC_EXECUTABLE="$OFFLINE_PREFIX/usr/bin/protoc"
             -DCMAKE_EXE_LINKER_FLAGS="-L$lib -Wl,-rpath-link,$lib"
             -DCMAKE_SHARED_LINKER_FLAGS="-L$lib" -DLONGHAUL_FUZZ=OFF)
    fi
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="${LONGHAUL_BUILD_TYPE:-RelWithDebInfo}" "${extra[@]}"
  fi
  cmake --build "$BUILD" -j "$jobs" ${1:+--target "$@"}
}

cmd="${1:-help}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  demo)
    for a in "$@"; do [[ "$a" == "-h" || "$a" == "--help" ]] && exec bash "$ROOT/tools/demo.sh" --help; done
    build
    exec bash "$ROOT/tools/demo.sh" "$@"
    ;;
  test)
    build
    cd "$BUILD"
    exec ctest --output-on-failure -j "${LONGHAUL_TEST_JOBS:-$(nproc)}" "$@"
    ;;
  build) build "$@" ;;
  help|-h|--help) usage ;;
  *) echo "longhaul.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac
