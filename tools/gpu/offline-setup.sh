#!/usr/bin/env bash
# GPU machine without a package registry: unpacks the .deb files that tools/gpu/fetch-debs.sh put in
# .deps/gpu/debs into the prefix .deps/gpu-prefix (never into /; a folder of its own, so that carrying
# .deps/gpu again does not remove it), and checks what the build needs
# from the machine itself: cmake, a C++ compiler, python3 with torch (LibTorch comes from the wheel).
# Called by ./longhaul.sh when .deps/gpu/debs exists; idempotent (a stamp skips the unpacking).
# Afterwards ./longhaul.sh passes the prefix to CMake and puts its libraries on LD_LIBRARY_PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEBS="$ROOT/.deps/gpu/debs"
PREFIX="$ROOT/.deps/gpu-prefix"
die() { echo "offline-setup: error: $*" >&2; exit 1; }

compgen -G "$DEBS/*.deb" >/dev/null || die "no .deb files in $DEBS (run tools/gpu/fetch-debs.sh on the development machine and carry .deps/gpu)"
for tool in cmake c++ python3; do command -v "$tool" >/dev/null || die "$tool is not installed on this machine"; done
command -v ninja >/dev/null || python3 -c 'import ninja' 2>/dev/null || die "ninja is not installed (pip's ninja works too)"
python3 -c 'import torch' 2>/dev/null || die "python3 cannot import torch (LibTorch comes from the PyTorch wheel here)"

# Unpacked again only when the set of .deb files changed (by name and size: carrying the folder
# again gives the files new times, and fresh header times would make the build start over).
stamp="$PREFIX/.unpacked"
want="$(cd "$DEBS" && ls -l --time-style=+ ./*.deb | awk '{print $5, $NF}')"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$PREFIX"; done
  # The default corpus of the demo and the tests (fortunes) lives at /usr/share/games/fortunes.
  if [[ ! -e /usr/share/games/fortunes && -d "$PREFIX/usr/share/games/fortunes" ]]; then
    { mkdir -p /usr/share/games && ln -sfn "$PREFIX/usr/share/games/fortunes" /usr/share/games/fortunes; } 2>/dev/null \
      || echo "offline-setup: note: cannot link /usr/share/games/fortunes (not root?); the default corpus is missing" >&2
  fi
  printf '%s' "$want" >"$stamp"
fi
# prometheus-cpp's CMake config finds civetweb (for its pull component, which we do not use), whose
# config insists that the civetweb program exists; the libcivetweb packages do not ship it.
[[ -e "$PREFIX/usr/bin/civetweb" ]] || { mkdir -p "$PREFIX/usr/bin" && : >"$PREFIX/usr/bin/civetweb"; }
echo "offline-setup: ok (prefix $PREFIX, torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)'))"
