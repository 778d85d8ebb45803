#!/usr/bin/env bash
# An A/B of two commits' workers on one GPU machine: the sweep (tools/gpu/checks.sh sweep, its
# SWEEP_* settings from the environment) run with each commit's longhaul-worker in turn, A B A B ...
#   git archive --format=tar A >.deps/a.tar; git archive --format=tar B >.deps/b.tar   # dev machine
#   tools/gpu/ab-sweep.sh OUT_DIR .deps/a.tar .deps/b.tar [ROUNDS]                     # GPU machine
# Both archives build in one tree (/var/tmp/lh-ab, B's built last: its bench, coordinator and
# checks.sh, which must know SWEEP_NO_BUILD, run both workers, so the commits may differ only in
# what the worker runs); each worker binary is kept and copied into build/bin before its runs, and
# a run whose worker is not that binary afterwards is reported as such. Each run's table and the sweep log's last lines are
# appended to OUT_DIR/ab.txt. A run starts only while fewer than AB_BUDGET_S seconds (default 480)
# have passed, so a device call's limit ends between runs; ROUNDS (default 2) pairs at most.
set -euo pipefail
OUT="${1:?usage: ab-sweep.sh OUT_DIR A.tar B.tar [ROUNDS]}"
A="$(realpath "${2:?usage: ab-sweep.sh OUT_DIR A.tar B.tar [ROUNDS]}")"
B="$(realpath "${3:?usage: ab-sweep.sh OUT_DIR A.tar B.tar [ROUNDS]}")"
ROUNDS="${4:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TREE=/var/tmp/lh-ab
BINS=/var/tmp/lh-ab-workers
mkdir -p "$OUT" "$BINS"
OUT="$(realpath "$OUT")"
for side in a b; do
  tar="$A"; [[ "$side" == b ]] && tar="$B"
  if [[ -x "$BINS/$side" ]] && cmp -s "$BINS/$side.tar" "$tar"; then
    echo "ab-sweep: worker $side already built from this archive"; continue
  fi
  "$ROOT/tools/gpu/from-archive.sh" "$tar" "$TREE" bash -c \
    "cd '$TREE' && ./longhaul.sh build longhaul-bench longhaul-worker longhaul-coordinator >'$OUT/build-$side.log' 2>&1" \
    || { tail -30 "$OUT/build-$side.log"; exit 1; }
  cp "$TREE/build/bin/longhaul-worker" "$BINS/$side"
  cp "$tar" "$BINS/$side.tar"
  echo "ab-sweep: worker $side built ($SECONDS s)"
done
# The tree and its other binaries B's (an incremental build: nothing, unless A was built last).
"$ROOT/tools/gpu/from-archive.sh" "$B" "$TREE" bash -c \
  "cd '$TREE' && ./longhaul.sh build longhaul-bench longhaul-worker longhaul-coordinator >'$OUT/build-b.log' 2>&1" \
  || { tail -30 "$OUT/build-b.log"; exit 1; }
grep -q SWEEP_NO_BUILD "$TREE/tools/gpu/checks.sh" \
  || { echo "ab-sweep: B's tools/gpu/checks.sh has no SWEEP_NO_BUILD: its sweeps would rebuild the worker"; exit 1; }
for ((r = 1; r <= ROUNDS; ++r)); do
  for side in a b; do
    if ((SECONDS > ${AB_BUDGET_S:-480})); then
      echo "ab-sweep: ${SECONDS} s passed, no run $side$r" | tee -a "$OUT/ab.txt"; exit 0
    fi
    cp "$BINS/$side" "$TREE/build/bin/longhaul-worker"
    run="/var/tmp/lh-ab-run/$side$r"
    rm -rf "$run"
    start=$SECONDS
    note=""
    (cd "$TREE" && SWEEP_NO_BUILD=1 tools/gpu/checks.sh "$run" sweep >/dev/null) || note=" FAILED"
    cmp -s "$TREE/build/bin/longhaul-worker" "$BINS/$side" || note="$note (the worker binary changed during the run)"
    { echo "## run $side$r ($((SECONDS - start)) s)$note"; cat "$run/gpu-sweep.md" 2>/dev/null || true
      tail -5 "$run/sweep.log" 2>/dev/null || true; echo; } >>"$OUT/ab.txt"
  done
done
