#!/usr/bin/env bash
# An A/B (or A/B/C...) of commits' GPU codecs on one GPU machine: longhaul-bench codec (8192 x 4096
# on cuda:0) with each commit's binary in turn, A B A B ..., after each commit's GPU codec tests
# (every codec's GPU frame byte for byte against the CPU's).
#   git archive --format=tar A >.deps/a.tar; git archive --format=tar B >.deps/b.tar   # dev machine
#   tools/gpu/ab-codec.sh OUT_DIR .deps/a.tar .deps/b.tar [MORE.tar ...] [ROUNDS]      # GPU machine
# The archives build in one tree (/var/tmp/lh-ab-codec, in the order given, so each build after the
# first recompiles only the files that differ: about a minute on 16 cores); each longhaul-bench is
# kept (the codecs are linked in statically), and reused by a later call on the same machine for the
# same archive (so one call may build, ROUNDS 0, and the next measure). The sides are named a, b,
# c, ... in that order. One line a run in OUT_DIR/ab-codec.txt (encode, decode and copy GB/s of the
# same run, encode / copy, decode / copy, frame byte-identical), then each side's mean. ROUNDS
# (each side once a round) default 4; AB_CODEC (default tahquant) and AB_DTYPE (fp32) choose the
# cell; PROF=1 adds Nsight Compute's kernel durations of each side (checks.sh codecprof, in
# OUT_DIR/prof-a, -b, ...). An archive written ARCHIVE.tar@VAR=VALUE runs its tests and bench with
# that variable in the environment (the same archive twice, once with a switch: one build).
set -euo pipefail
usage="usage: ab-codec.sh OUT_DIR A.tar[@VAR=VALUE] B.tar[@VAR=VALUE] [MORE.tar ...] [ROUNDS]"
OUT="${1:?$usage}"
shift
ROUNDS=4
TARS=()
ENVS=()  # each side's VAR=VALUE, or empty
with_env() {  # side_index command...: the command with that side's variable, if any
  env ${ENVS[$1]:+"${ENVS[$1]}"} "${@:2}"
}
for arg in "$@"; do
  if [[ "$arg" =~ ^[0-9]+$ ]]; then
    ROUNDS="$arg"
  elif [[ "$arg" =~ ^(.*\.tar)@([A-Za-z_][A-Za-z0-9_]*=.*)$ ]]; then
    TARS+=("$(realpath "${BASH_REMATCH[1]}")")
    ENVS+=("${BASH_REMATCH[2]}")
  elif [[ "$arg" == *.tar@* ]]; then
    echo "ab-codec: '$arg': expected ARCHIVE.tar@VAR=VALUE" >&2
    exit 2
  else
    TARS+=("$(realpath "$arg")")
    ENVS+=("")
  fi
done
NAMES=(a b c d e f g h)
if ((${#TARS[@]} < 2 || ${#TARS[@]} > ${#NAMES[@]})); then echo "$usage (2 to ${#NAMES[@]} archives)" >&2; exit 2; fi
SIDES=("${NAMES[@]:0:${#TARS[@]}}")
CODEC="${AB_CODEC:-tahquant}"
DTYPE="${AB_DTYPE:-fp32}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TREE=/var/tmp/lh-ab-codec
BINS=/var/tmp/lh-ab-codec-bins
mkdir -p "$OUT" "$BINS"
OUT="$(realpath "$OUT")"
# The offline prefix's libraries, for the binaries started directly (as checks.sh).
if [[ -d "$ROOT/.deps/gpu/debs" ]]; then
  export LD_LIBRARY_PATH="$ROOT/.deps/gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for ((i = 0; i < ${#TARS[@]}; ++i)); do
  side="${SIDES[$i]}"
  # A binary built from the same archive earlier on this machine is reused (a call that only
  # builds, ROUNDS 0, then one that measures, while the machine is held).
  sum="$(sha256sum "${TARS[$i]}" | cut -c1-16)"
  cached="$BINS/by-archive/$sum"
  if [[ -x "$cached" && -x "$cached.test-bin" ]]; then
    cp "$cached" "$BINS/$side"
    cp "$cached.test-bin" "$BINS/$side.test-bin"
    how="reused (built earlier from the same archive)"
  else
    "$ROOT/tools/gpu/from-archive.sh" "${TARS[$i]}" "$TREE" bash -c \
      "cd '$TREE' && ./longhaul.sh build longhaul-bench gpu_codec_test >'$OUT/build-$side.log' 2>&1" \
      || { tail -30 "$OUT/build-$side.log"; exit 1; }
    cp "$TREE/build/bin/longhaul-bench" "$BINS/$side"
    cp "$TREE/build/tests/gpu_codec_test" "$BINS/$side.test-bin"
    # Into the cache under a temporary name first: a killed run leaves no half-copied binary.
    mkdir -p "$BINS/by-archive"
    cp "$BINS/$side" "$cached.tmp" && mv "$cached.tmp" "$cached"
    cp "$BINS/$side.test-bin" "$cached.tmp" && mv "$cached.tmp" "$cached.test-bin"
    how="built ($SECONDS s)"
  fi
  # The tests once an archive and switch (their log cached with the binaries).
  tests_log="$cached.tests${ENVS[$i]:+.$(echo "${ENVS[$i]}" | sha256sum | cut -c1-8)}"
  if [[ ! -f "$tests_log" ]]; then
    with_env "$i" "$BINS/$side.test-bin" >"$tests_log.tmp" 2>&1 || true
    mv "$tests_log.tmp" "$tests_log"
  fi
  cp "$tests_log" "$OUT/gpu-codec-test-$side.log"
  echo "ab-codec: $side${ENVS[$i]:+ (${ENVS[$i]})} $how, its GPU codec tests: $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ tests?' "$OUT/gpu-codec-test-$side.log" | tr '\n' ' ')"
done
last="${SIDES[-1]}"
run_side() {  # side_index round
  local side="${SIDES[$1]}" json
  json="$(with_env "$1" "$BINS/$side" codec --device=cuda:0 --codec="$CODEC" --dtype="$DTYPE" --tokens=8192 \
    --hidden=4096 --json 2>>"$OUT/bench-$side.log")" || { echo "$side $2 FAILED (bench-$side.log)"; return; }
  python3 - "$side" "$2" "$json" <<'PY'
import json, sys
side, pair, text = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.loads(text)
r = d["results"][0] if isinstance(d.get("results"), list) else d
e, dec, c = r["encode_gbps"], r["decode_gbps"], r["copy_gbps"]
print(f"{side} {pair} encode {e:.1f} decode {dec:.1f} copy {c:.1f} encode/copy {e / c:.4f} "
      f"decode/copy {dec / c:.4f} byte_identical {r['byte_identical']}")
PY
}
{
  echo "# $CODEC $DTYPE 8192 x 4096, $(for ((i = 0; i < ${#TARS[@]}; ++i)); do printf '%s %s%s, ' "${SIDES[$i]}" "$(basename "${TARS[$i]}")" "${ENVS[$i]:+@${ENVS[$i]}}"; done)$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
  for ((p = 1; p <= ROUNDS; ++p)); do
    for ((i = 0; i < ${#SIDES[@]}; ++i)); do run_side "$i" "$p"; done
  done
} | tee "$OUT/ab-codec.txt"
awk '$3 == "encode" { e[$1] += $10; d[$1] += $12; n[$1]++ }
     END { for (s in n) printf "%s mean of %d: encode/copy %.4f decode/copy %.4f\n", s, n[s], e[s] / n[s], d[s] / n[s] }' \
  "$OUT/ab-codec.txt" | sort | tee -a "$OUT/ab-codec.txt"
if [[ -n "${PROF:-}" ]]; then
  for ((i = 0; i < ${#SIDES[@]}; ++i)); do
    side="${SIDES[$i]}"
    cp "$BINS/$side" "$TREE/build/bin/longhaul-bench"
    (cd "$TREE" && with_env "$i" PROF_CODECS="$CODEC" tools/gpu/checks.sh "$OUT/prof-$side" codecprof) \
      | grep -E "^  [A-Za-z]|Duration|no Nsight" | sed "s/^/$side /" || true
  done
  cp "$BINS/$last" "$TREE/build/bin/longhaul-bench"
fi
