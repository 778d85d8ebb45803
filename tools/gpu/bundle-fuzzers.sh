#!/usr/bin/env bash
# Development machine: copies the libFuzzer targets built here (build/fuzz, the clang sub-build of
# tests/fuzz) stripped, with their corpora and dictionary, into .deps/fuzz (git-ignored), for the
# long fuzz runs of docs/security.md on a machine with more cores (tools/gpu/checks.sh fuzz; its
# shared libraries come from the offline packages of .deps/gpu). Carry .deps/fuzz and .deps/gpu.
# Usage: tools/gpu/bundle-fuzzers.sh [TARGET...]   (default: chunk_wire job_spec state_file)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/.deps/fuzz"
targets=("$@")
((${#targets[@]})) || targets=(chunk_wire job_spec state_file)
rm -rf "$OUT"
mkdir -p "$OUT"
for t in "${targets[@]}"; do
  bin="$ROOT/build/fuzz/fuzz_$t"
  [[ -x "$bin" ]] || { echo "bundle-fuzzers: no $bin (./longhaul.sh build longhaul_fuzzers)" >&2; exit 1; }
  strip -o "$OUT/fuzz_$t" "$bin"
  mkdir -p "$OUT/corpus_$t"
  if [[ -d "$ROOT/build/fuzz/corpus_$t" ]]; then cp -r "$ROOT/build/fuzz/corpus_$t/." "$OUT/corpus_$t/"; fi
  if [[ -d "$ROOT/tests/fuzz/seeds/$t" ]]; then cp -r "$ROOT/tests/fuzz/seeds/$t/." "$OUT/corpus_$t/"; fi
done
cp "$ROOT/tests/fuzz/job_spec.dict" "$OUT/"
echo "bundle-fuzzers: $(du -sh "$OUT" | cut -f1) in $OUT: ${targets[*]}"
