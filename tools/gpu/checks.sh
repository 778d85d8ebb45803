#!/usr/bin/env bash
# The GPU machine's checks, as run for docs/gpu.md: every step writes its output under OUT_DIR.
#   tools/gpu/checks.sh OUT_DIR [STEP...]
# Steps (default: build test bench data job):
#   build     ./longhaul.sh build (offline or apt, see docs/gpu.md)
#   codec     only the GPU codec tests (byte identity with the CPU reference): build and run them
#   test      ./longhaul.sh test -L gpu
#   bench     longhaul-bench stage: one gpt2-xl stage of 12 layers, bf16 (MFU)
#   data      SentencePiece tokens of the fortunes corpus into /var/tmp/longhaul/fortunes-sp
#   job       4 workers sharing cuda:0 train deploy/jobs/gpt2-small-fortunes.yaml for 50 steps
#   fidelity  in-process 4-stage gpt2-small shape on those tokens, fp32 links vs tahquant/int8,
#             FIDELITY_STEPS steps (default 1000), both runs at once on cuda:0
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?usage: tools/gpu/checks.sh OUT_DIR [build|codec|test|bench|data|job|fidelity ...]}"
shift
steps=("$@")
((${#steps[@]})) || steps=(build test bench data job)
mkdir -p "$OUT"
cd "$ROOT"
export LONGHAUL_JOBS="${LONGHAUL_JOBS:-$(nproc)}"
DATA=/var/tmp/longhaul/fortunes-sp
# The offline prefix's libraries (unpacked by the first build), for the binaries started directly below.
[[ -d "$ROOT/.deps/gpu/debs" ]] && export LD_LIBRARY_PATH="$ROOT/.deps/gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

for step in "${steps[@]}"; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    build) ./longhaul.sh build >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
           grep -E "LibTorch:|CUDA parts" build/CMakeCache.txt "$OUT/build.log" | head -5 || true ;;
    codec) ./longhaul.sh build gpu_codec_test >"$OUT/build-codec.log" 2>&1 || { tail -40 "$OUT/build-codec.log"; exit 1; }
           build/tests/gpu_codec_test 2>&1 | tee "$OUT/gpu-codec-test.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED)|Failure|first differing|Expected|Which is|actual" | head -60 ;;
    test) ./longhaul.sh test -L gpu 2>&1 | tee "$OUT/gpu-tests.log" | tail -15 ;;
    bench) nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
           build/bin/longhaul-bench stage --device=cuda:0 --preset=gpt2-xl --layers=12 --precision=bf16 --json \
             | tee "$OUT/stage-bench.json" ;;
    data) build/bin/longhaul-data prepare --input=/usr/share/games/fortunes --out="$DATA" --vocab-size=8000 \
            2>&1 | { grep -v "LOG(INFO)" || true; } | tee "$OUT/data.log" ;;
    job) ./longhaul.sh demo --spec deploy/jobs/gpt2-small-fortunes.yaml --device=cuda:0 --threads=4 --steps=50 \
           --summary-json="$OUT/job-summary.json" --run-dir=/var/tmp/longhaul/job >"$OUT/job.log" 2>&1 \
           || { tail -30 "$OUT/job.log"; tail -20 /var/tmp/longhaul/job/worker-*.log; exit 1; }
         tail -12 "$OUT/job.log"; cat "$OUT/job-summary.json" ;;
    fidelity)
      n="${FIDELITY_STEPS:-1000}"
      common=(--preset=gpt2-small --context=256 --vocab=8000 --data-format=tokens-u16 --corpus="$DATA"
              --device=cuda:0 --precision=bf16 --stages=4 --micro-batches=4 --micro-batch-size=8 --lr=6e-4
              --steps="$n" --eval-every=100 --val-batches=32 --codec-threads=4 --seed=1 --json)
      build/bin/longhaul-bench convergence "${common[@]}" --codec=fp32 --bwd-codec=fp32 \
        >"$OUT/fidelity-fp32.json" 2>"$OUT/fidelity-fp32.log" &
      a=$!
      build/bin/longhaul-bench convergence "${common[@]}" --codec=tahquant --bwd-codec=int8 \
        >"$OUT/fidelity-tahquant.json" 2>"$OUT/fidelity-tahquant.log" &
      b=$!
      rc=0; wait $a || rc=$?; wait $b || rc=$?
      ((rc == 0)) || { tail -5 "$OUT"/fidelity-*.log; exit "$rc"; }
      cat "$OUT/fidelity-fp32.json" "$OUT/fidelity-tahquant.json" ;;
    *) echo "checks: unknown step '$step'" >&2; exit 2 ;;
  esac
done
