#!/usr/bin/env bash
# longhaul's two entry points (README quick start):
#   ./longhaul.sh demo [options]   run the main job: a local coordinator + 4 workers training a small
#                                  GPT over gRPC with compressed, rate-limited links (tools/demo.sh)
#   ./longhaul.sh test [ctest args] build and run the whole test suite; non-zero exit on any failure
# Both install missing Debian packages on first use (tools/setup.sh) and build incrementally into
# build/ (executables in build/bin/).
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
                      --summary-json PATH, --rate-mbit R, ... (./longhaul.sh demo --help)
  test [ctest args]   build and run the whole CTest suite (e.g. ./longhaul.sh test -L codec)
  build               install what is missing and build, nothing else
  help                this text

environment: LONGHAUL_JOBS (build parallelism, default: nproc), LONGHAUL_BUILD_TYPE (RelWithDebInfo)
USAGE
}

setup() {
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
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="${LONGHAUL_BUILD_TYPE:-RelWithDebInfo}"
  fi
  cmake --build "$BUILD" -j "$jobs"
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
  build) build ;;
  help|-h|--help) usage ;;
  *) echo "longhaul.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac
