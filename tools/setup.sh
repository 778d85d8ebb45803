#!/usr/bin/env bash
# Installs what longhaul needs on Debian 12, Ubuntu 22.04 or Ubuntu 24.04 (root), unattended and
# idempotent (same package names on the three). Fast when everything is present: one dpkg query,
# one BLAS check. When python3 can import torch (a rented GPU box with the PyTorch wheel), LibTorch
# comes from the wheel and Debian's CPU-only libtorch-dev is not installed.
# (A machine without a package registry uses tools/gpu/offline-setup.sh instead; docs/gpu.md.)
# Usage: tools/setup.sh        (called by ./longhaul.sh on first use)
#        tools/setup.sh --render-tools   only the optional tools of tools/render-dashboards.sh
set -euo pipefail

# Optional, installed on demand by tools/render-dashboards.sh (the dashboard pictures of
# docs/observability.md), never by the main setup: headless Chromium (about 100 MB with its
# libraries) and Python's PIL, which crops the screenshots.
if [[ "${1:-}" == "--render-tools" ]]; then
  need=()
  for p in chromium python3-pil; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" == "install ok installed" ]] || need+=("$p")
  done
  ((${#need[@]})) || exit 0
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  echo "setup: installing ${need[*]} (dashboard pictures; log in /tmp/longhaul-apt.log)"
  export DEBIAN_FRONTEND=noninteractive
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
    >/tmp/longhaul-apt.log 2>&1 || { tail -20 /tmp/longhaul-apt.log >&2; echo "setup: error: could not install ${need[*]}" >&2; exit 1; }
  exit 0
fi

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libopenblas0-pthread prometheus-cpp-dev libboost-dev
  libssl-dev
  libsqlite3-dev sqlite3 libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev
  clang
  libcli11-dev libboost-filesystem-dev libsentencepiece-dev
  fortunes fortunes-min
  python3-venv
  iproute2
  prometheus
)
# prometheus: promtool (the metrics tests lint every /metrics with it) and the server that scrapes
# the daemons (docs/observability.md).

die() { echo "setup: error: $*" >&2; exit 1; }

if [[ -r /etc/os-release ]]; then
  . /etc/os-release
  case "${ID:-}-${VERSION_ID:-}" in
    debian-12|ubuntu-22.04|ubuntu-24.04) ;;
    *) echo "setup: warning: tested on Debian 12 and Ubuntu 22.04/24.04, this is ${PRETTY_NAME:-unknown}; trying anyway" >&2 ;;
  esac
fi
python3 -c 'import torch' 2>/dev/null || PACKAGES+=(libtorch-dev)
# The libFuzzer runtime of the distribution's clang (libclang-rt-14-dev on Debian 12): optional.
clang_major=$(apt-cache policy clang 2>/dev/null | sed -n 's/^ *Candidate: *\([0-9]*:\)\{0,1\}\([0-9]*\).*/\2/p')
OPTIONAL=()
[[ -n "$clang_major" ]] && OPTIONAL+=("libclang-rt-${clang_major}-dev")

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} missing package(s): ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
      die "need root to install: ${missing[*]} (run as root or install them yourself)"; fi
  else SUDO=""; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || die "apt-get update failed (is Debian's package registry reachable?)"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/longhaul-apt.log 2>&1 \
    || { tail -20 /tmp/longhaul-apt.log >&2; die "apt-get install failed; full log in /tmp/longhaul-apt.log"; }
fi

for p in "${OPTIONAL[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] && continue
  ${SUDO:-} apt-get install -y -qq --no-install-recommends "$p" >>/tmp/longhaul-apt.log 2>&1 \
    || echo "setup: note: optional $p not installed (the fuzz targets are skipped)" >&2
done

# LibTorch links libblas.so.3; Debian's default alternative is the reference BLAS, 26x slower.
# Point the alternative at OpenBLAS (pthread flavour) and check it.
blas_target=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
if [[ "$blas_target" != *openblas* ]]; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas | head -1 || true)
  [[ -n "$alt" ]] || die "OpenBLAS is not registered as a libblas.so.3 alternative (is libopenblas0-pthread installed?)"
  update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null \
    || die "could not select OpenBLAS as libblas.so.3 ($alt)"
  blas_target=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)
  [[ "$blas_target" == *openblas* ]] || die "libblas.so.3 still points at $blas_target, not OpenBLAS"
fi
# The Hugging Face export test (tests/integration/hf_export_test.cc) loads exported models with
# Python's transformers, from PyPI, in a virtual environment: .deps/venv (git-ignored). PyPI has no
# CPU-only torch: its Linux wheel brings the CUDA libraries (about 3 GB, once). Skipped when the
# pinned set is there (a stamp in the venv); LONGHAUL_NO_VENV=1 skips it (the test then skips too).
VENV_REQS="torch==2.5.1 transformers==4.46.3 safetensors==0.4.5"
venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.deps/venv"
if [[ "${LONGHAUL_NO_VENV:-0}" != 1 && "$(cat "$venv/.longhaul-reqs" 2>/dev/null)" != "$VENV_REQS" ]]; then
  echo "setup: installing $VENV_REQS into $venv (from PyPI; log in /tmp/longhaul-venv.log)"
  # A half-made environment must not look ready: the stamp is written last, and a failure removes it.
  { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; } >/tmp/longhaul-venv.log 2>&1 &&
    "$venv/bin/python" -m pip install -q $VENV_REQS >>/tmp/longhaul-venv.log 2>&1 ||
    { tail -20 /tmp/longhaul-venv.log >&2; rm -rf "$venv"
      die "could not install the Python packages of the export test (is PyPI reachable? LONGHAUL_NO_VENV=1 skips them)"; }
  echo "$VENV_REQS" >"$venv/.longhaul-reqs"
fi
echo "setup: ok (BLAS: $blas_target)"
