#!/usr/bin/env bash
# The GPU machine's checks, as run for docs/gpu.md: every step writes its output under OUT_DIR.
#   tools/gpu/checks.sh OUT_DIR [STEP...]
# Steps (default: build test bench data job):
#   build     ./longhaul.sh build (offline or apt, see docs/gpu.md)
#   codec     only the GPU codec tests (byte identity with the CPU reference): build and run them
#   codecbench  longhaul-bench codec --device=cuda:0 for each codec family, 8192 x 4096 fp32 and bf16
#             (CODECS to name fewer families)
#   codecprof where the grouped codecs' time goes: Nsight Compute's duration, throughput, occupancy
#             and main stall for each kernel of one tahquant and one int8 encode and decode (PROF_CODECS,
#             PROF_LINES; clocks unlocked as in the bench, PROF_CLOCKS=base to lock them; PROF_SOURCE=REGEX
#             adds the matching kernels' SASS with instructions executed per line)
#   codectrace  where one encode's time goes on the GPU's clock: each kernel's start, end and overlap
#             under the dependent launches (longhaul-bench codec --trace, LibTorch's profiler: Nsight
#             Compute serialises the kernels), 8192 x 4096 fp32, for TRACE_CODECS (default tahquant)
#   sweep     docs/gpu-sweep.md: 4 workers, one GPU each (the first 4; on fewer GPUs they are dealt in
#             turn and share them; SWEEP_DEVICES=cuda:0,... to choose), each in its own network
#             namespace with tc tbf access links, a gpt2-xl-shaped pipeline (SWEEP_LAYERS, default 48,
#             over 4 stages, bf16), fp32 vs tahquant/int8 links at SWEEP_RATES (default 100 Mbit/s:
#             with SWEEP_MICRO_BATCHES 32, the paper's batch, a 100 Mbit/s fp32 step takes ~40 s, so
#             one 600 s device call runs one or two rates: 100, then 300, then 1000,500; SWEEP_STEPS 3
#             (the idle table in gpu-sweep.md profiles steps 2..N-1: 4 gives it two steps);
#             SWEEP_SCHEDULE gpipe; SWEEP_TCP_CONGESTION the hosts' congestion control, default the
#             bench's, cubic; "host": the machine's; SWEEP_PACE the senders' pace as a fraction of the
#             TCP payload the rate carries, default the bench's, 0.98; 0: unpaced; SWEEP_CODECS the forward
#             codecs, default fp32,tahquant; SWEEP_BACKWARD the quantised codecs' backward, default int8,
#             e.g. int6:g=32 as the TAH-Quant authors' scripts; SWEEP_UNSHAPED_REPEATS the unshaped
#             jobs per codec whose median is the compute bound, default 3, about 15 s each: one moved
#             by a fifth), the link trace in link-trace.csv.gz; SWEEP_NO_BUILD=1 runs the binaries as
#             they are (an A/B that swaps build/bin/longhaul-worker between runs)
#   dpsweep   docs/replicated-stages.md's data-parallel cells on this machine's cores (no GPU):
#             longhaul-bench sweep --data-parallel --repeats 5 (DPSWEEP_REPEATS), the table in
#             dp-sweep.md and the round lines (each stage's bucket spans) in dp-rounds.txt;
#             DPSWEEP_PROCESSES=1: the cells as jobs of worker processes (--processes)
#   pipeline  where the sweep's step time goes: deploy/jobs/gpt2-xl-pipeline.yaml (unshaped, fp32
#             links) on 4 workers sharing cuda:0, with 1 and 4 LibTorch threads per worker; GPU
#             utilisation (nvidia-smi dmon) and every worker's /metrics mid-run
#   bootstrap docs/deploy.md's GPU run: a coordinator on this machine, then deploy/bootstrap.sh (offline
#             packages, build, install into /var/tmp/longhaul/boot, worker in the foreground) until
#             the coordinator lists the worker; run it first on a fresh machine to see every step
#   test      ./longhaul.sh test -L gpu
#   fuzz      the long fuzz runs of docs/security.md over every core (targets from tools/gpu/bundle-fuzzers.sh)
#   bench     longhaul-bench stage: one gpt2-xl stage of 12 layers, bf16 (MFU)
#   stageprof the sweep's stages alone: longhaul-bench stage at its micro-batch (one 1,024-token
#             sequence, 32 micro-batches) for the first, a middle and the last stage, beside B = 8
#             (issue_seconds: the host's queueing time) and at 1/8 the context, in stageprof.jsonl;
#             one iteration of the middle stage under LibTorch's profiler (stage-mb1-trace.json.gz,
#             summarised by tools/torch-trace-summary.py)
#   data      SentencePiece tokens of the fortunes corpus into /var/tmp/longhaul/fortunes-sp
#   job       4 workers sharing cuda:0 train deploy/jobs/gpt2-small-fortunes.yaml for 50 steps
#   fidelity  in-process 4-stage gpt2-small shape on those tokens, fp32 links vs tahquant/int8,
#             FIDELITY_STEPS steps (default 1000), both runs at once on cuda:0
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?usage: tools/gpu/checks.sh OUT_DIR [build|codec|codecbench|codectrace|codecprof|sweep|dpsweep|pipeline|bootstrap|fuzz|test|bench|stageprof|data|job|fidelity ...]}"
shift
steps=("$@")
((${#steps[@]})) || steps=(build test bench data job)
mkdir -p "$OUT"
cd "$ROOT"
export LONGHAUL_JOBS="${LONGHAUL_JOBS:-$(nproc)}"
DATA=/var/tmp/longhaul/fortunes-sp
# The offline prefix's libraries (unpacked by the first build), for the binaries started directly below.
# Its ip and tc too, where the machine has no iproute2 (appended: the machine's own come first).
if [[ -d "$ROOT/.deps/gpu/debs" ]]; then
  P="$ROOT/.deps/gpu-prefix"
  export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$PATH:$P/usr/sbin:$P/usr/bin:$P/sbin:$P/bin"
fi

for step in "${steps[@]}"; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    build) ./longhaul.sh build >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
           grep -E "LibTorch:|CUDA parts" build/CMakeCache.txt "$OUT/build.log" | head -5 || true
           echo "lines with \"warning\" in the build's log: $(grep -ci warning "$OUT/build.log" || true)" ;;
    codec) ./longhaul.sh build gpu_codec_test >"$OUT/build-codec.log" 2>&1 || { tail -40 "$OUT/build-codec.log"; exit 1; }
           build/tests/gpu_codec_test 2>&1 | tee "$OUT/gpu-codec-test.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED)|Failure|first differing|Expected|Which is|actual" | head -60 ;;
    codecbench)
      for codec in ${CODECS:-tahquant int8 int4 sdp4bit-tlqhs zeropp-qw bitdp2 bf16}; do
        for dtype in fp32 bf16; do
          build/bin/longhaul-bench codec --device=cuda:0 --codec="$codec" --dtype="$dtype" --tokens=8192 \
            --hidden=4096 --json >"$OUT/codec-$codec-$dtype.json" 2>"$OUT/codec-$codec-$dtype.log" \
            || { echo "codec bench $codec $dtype failed:"; tail -5 "$OUT/codec-$codec-$dtype.log"; }
        done
      done
      python3 - "$OUT" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "codec-*.json"))):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable:", e); continue
    r = d.get("results", [d])[0] if isinstance(d.get("results"), list) else d
    keys = ("encode_gbps", "decode_gbps", "copy_gbps", "encode_to_host_gbps", "bits_per_element", "byte_identical")
    print(os.path.basename(f), {k: r.get(k) for k in keys})
PY
      ;;
    codectrace)
      for codec in ${TRACE_CODECS:-tahquant}; do
        build/bin/longhaul-bench codec --device=cuda:0 --codec="$codec" --tokens=8192 --hidden=4096 --iters=20 \
          --trace="$OUT/trace-$codec.json" >"$OUT/trace-$codec.txt" 2>&1 \
          || { echo "codec trace $codec failed:"; tail -5 "$OUT/trace-$codec.txt"; continue; }
        python3 tools/torch-trace-summary.py "$OUT/trace-$codec.json" --top 8 --timeline 16 \
          | tee "$OUT/trace-$codec-summary.txt" || echo "codectrace $codec: no summary"
        gzip -f "$OUT/trace-$codec.json" || true
      done
      ;;
    codecprof)
      ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
      if [[ -z "$ncu_bin" ]]; then echo "codecprof: no Nsight Compute (ncu) on this machine"; continue; fi
      for codec in ${PROF_CODECS:-tahquant int8}; do
        # The first 8 launches of the codec's kernels: the check calls, then the timed ones.
        # Clocks as the bench runs them (PROF_CLOCKS=base: Nsight Compute's default, locked to base).
        "$ncu_bin" --target-processes all --clock-control "${PROF_CLOCKS:-none}" -k 'regex:Encode|Decode|Stats|Allocate|Init' -c 8 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          build/bin/longhaul-bench codec --device=cuda:0 --codec="$codec" --tokens=8192 --hidden=4096 --iters=1 --json \
          >"$OUT/ncu-$codec.txt" 2>&1 || { echo "ncu $codec failed:"; tail -5 "$OUT/ncu-$codec.txt"; }
        echo "-- $codec"
        grep -E "^  [A-Za-z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued|each warp of this workload spends" "$OUT/ncu-$codec.txt" \
          | sed -E 's/^  (void )?([^ (][^(]*)\(.*/  \2/' | cut -c1-190 | head -"${PROF_LINES:-48}"
        # PROF_SOURCE=REGEX: each matching kernel's SASS with its executed instructions and stall
        # samples per line (the first launch of each), in ncu-source-CODEC.txt.
        if [[ -n "${PROF_SOURCE:-}" ]]; then
          "$ncu_bin" --target-processes all --clock-control "${PROF_CLOCKS:-none}" --cache-control none -k "regex:$PROF_SOURCE" -c "${PROF_SOURCE_COUNT:-2}" \
            --section SourceCounters --page source --print-source sass \
            build/bin/longhaul-bench codec --device=cuda:0 --codec="$codec" --tokens=8192 --hidden=4096 --iters=1 --json \
            >"$OUT/ncu-source-$codec.txt" 2>&1 || { echo "ncu source $codec failed:"; tail -5 "$OUT/ncu-source-$codec.txt"; }
        fi
      done ;;
    sweep)
      if [[ -z "${SWEEP_NO_BUILD:-}" ]]; then
        ./longhaul.sh build longhaul-bench longhaul-worker longhaul-coordinator >"$OUT/build-sweep.log" 2>&1 \
          || { tail -40 "$OUT/build-sweep.log"; exit 1; }
      fi
      # tc in network namespaces where ip can make one, else the in-process shaper (said in the log).
      shaper=tc
      if ! { ip netns add lhprobe && ip netns del lhprobe; } >"$OUT/netns-probe.log" 2>&1; then
        shaper=inprocess; echo "sweep: no network namespaces here ($(head -c 200 "$OUT/netns-probe.log")); in-process shaper"
      fi
      # One GPU per worker where there are enough: the visible GPUs (CUDA_VISIBLE_DEVICES, else
      # nvidia-smi's list of physical GPUs), numbered from 0 as the workers' CUDA sees them.
      if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
      else
        gpus=$({ nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true; } | grep -c '^[0-9]' || true)
      fi
      devices="${SWEEP_DEVICES:-$(awk -v n="${gpus:-0}" 'BEGIN {for (i = 0; i < n && i < 4; ++i) printf "%scuda:%d", (i ? "," : ""), i}')}"
      devices="${devices:-cuda:0}"
      echo "sweep: workers on $devices"
      # The link trace needs tc and 3 steps or more (the bench refuses it otherwise).
      trace=""
      [[ "$shaper" == tc && "${SWEEP_STEPS:-3}" -ge 3 ]] && trace="$OUT/link-trace.csv"
      mkdir -p /var/tmp/longhaul
      TMPDIR=/var/tmp/longhaul build/bin/longhaul-bench sweep --shaper="$shaper" --preset=gpt2-xl --layers="${SWEEP_LAYERS:-48}" --stages=4 --device="$devices" \
        --precision=bf16 --context=1024 --micro-batches="${SWEEP_MICRO_BATCHES:-32}" --micro-batch-size=1 \
        --schedule="${SWEEP_SCHEDULE:-gpipe}" --steps="${SWEEP_STEPS:-3}" --repeats=1 --unshaped-repeats="${SWEEP_UNSHAPED_REPEATS:-3}" --rates="${SWEEP_RATES:-100}" --codecs="${SWEEP_CODECS:-fp32,tahquant}" --backward="${SWEEP_BACKWARD:-int8}" \
        ${SWEEP_TCP_CONGESTION:+--tcp-congestion="$SWEEP_TCP_CONGESTION"} ${SWEEP_PACE:+--pace="$SWEEP_PACE"} --markdown="$OUT/gpu-sweep.md" ${trace:+--link-trace="$trace"} >"$OUT/sweep.log" 2>&1 || { tail -30 "$OUT/sweep.log"; exit 1; }
      [[ -f "$OUT/link-trace.csv" ]] && gzip -f "$OUT/link-trace.csv"
      cat "$OUT/gpu-sweep.md" ;;
    dpsweep)
      ./longhaul.sh build longhaul-bench longhaul-worker longhaul-coordinator >"$OUT/build-dpsweep.log" 2>&1 \
        || { tail -40 "$OUT/build-dpsweep.log"; exit 1; }
      build/bin/longhaul-bench sweep --data-parallel ${DPSWEEP_PROCESSES:+--processes} --repeats="${DPSWEEP_REPEATS:-5}" \
        --markdown="$OUT/dp-sweep.md" >/dev/null 2>"$OUT/dp-rounds.txt" || { tail -20 "$OUT/dp-rounds.txt"; exit 1; }
      cat "$OUT/dp-sweep.md" ;;
    pipeline)
      ./longhaul.sh build longhaul-worker longhaul-coordinator longhaulctl >"$OUT/build-pipeline.log" 2>&1 \
        || { tail -40 "$OUT/build-pipeline.log"; exit 1; }
      for t in 1 4; do
        rd=/var/tmp/longhaul/pipeline-t$t
        rm -rf "$rd"
        nvidia-smi dmon -s u -d 1 >"$OUT/dmon-t$t.txt" 2>&1 &
        dmon=$!
        ( sleep "${PIPELINE_SCRAPE_AFTER:-60}"
          for f in "$rd"/worker-*.log; do
            port=$(sed -n 's/.*metrics on [^ ]*:\([0-9]*\).*/\1/p' "$f" | head -1)
            [[ -n "$port" ]] && curl -s "http://127.0.0.1:$port/metrics" >"$OUT/metrics-t$t-$(basename "$f" .log).txt"
          done ) &
        ./longhaul.sh demo --spec deploy/jobs/gpt2-xl-pipeline.yaml --device=cuda:0 --threads="$t" --rate-mbit 0 \
          --summary-json="$OUT/pipeline-t$t.json" --run-dir="$rd" >"$OUT/pipeline-t$t.log" 2>&1 \
          || { tail -20 "$OUT/pipeline-t$t.log"; tail -5 "$rd"/worker-*.log; }
        kill "$dmon" 2>/dev/null || true
        wait
        echo "threads $t:"; tail -4 "$OUT/pipeline-t$t.log"
        awk 'NR > 2 && $2 ~ /^[0-9]+$/ { s += $2; n++ } END { if (n) printf "  GPU busy (dmon sm%%) mean %.0f%% over %d s\n", s / n, n }' "$OUT/dmon-t$t.txt"
        rm -rf "$rd"/worker-*/jobs
      done ;;
    bootstrap)
      ./longhaul.sh build longhaul-coordinator longhaulctl >"$OUT/build-boot.log" 2>&1 \
        || { tail -40 "$OUT/build-boot.log"; exit 1; }
      b=/var/tmp/longhaul/boot
      rm -rf "$b"; mkdir -p "$b"
      addr="$(hostname -I | awk '{print $1}')"
      build/bin/longhaul-coordinator --listen=0.0.0.0:7400 --state="$b/coordinator.db" --metrics-listen=none \
        >"$OUT/boot-coordinator.log" 2>&1 &
      cp=$!
      # The coordinator made its CA in $b/longhaul-pki: a join token and the CA fingerprint for the worker.
      export LONGHAUL_PKI_DIR="$b/longhaul-pki"
      token=""
      for _ in $(seq 50); do
        token=$(build/bin/longhaulctl --coordinator="$addr:7400" token create --ttl=1h 2>"$OUT/token.log") && break
        sleep 0.2
      done
      fingerprint=$(sed -n 's/^CA fingerprint //p' "$OUT/token.log")
      [[ -n "$token" && -n "$fingerprint" ]] || { echo "bootstrap: no join token: $(cat "$OUT/token.log")"; exit 1; }
      SECONDS=0
      LONGHAUL_JOIN_TOKEN="$token" deploy/bootstrap.sh --coordinator "$addr:7400" --ca-fingerprint "$fingerprint" \
        --prefix "$b/bin" --data-dir "$b/data" --name gpu-bootstrap >"$OUT/bootstrap.log" 2>&1 &
      bp=$!
      until grep -q "worker registered" "$OUT/bootstrap.log" || ! kill -0 "$bp" 2>/dev/null || ((SECONDS > 480)); do
        sleep 2
      done
      echo "bootstrap: $SECONDS s to a registered worker (or to giving up)"
      build/bin/longhaulctl --coordinator="$addr:7400" workers || true
      kill -TERM "$bp" 2>/dev/null || true
      wait "$bp" || echo "bootstrap exited with $?"
      kill "$cp"; wait "$cp" || true
      cat "$OUT/bootstrap.log" ;;
    fuzz)
      # docs/security.md's long fuzz runs on this machine's cores: the targets built on the
      # development machine (tools/gpu/bundle-fuzzers.sh; carry .deps/fuzz), FUZZ_RUNS executions
      # in all (default 10^7) split over one job per core, each with its own log; FUZZ_TARGETS
      # chooses (default: chunk_wire job_spec state_file); FUZZ_SECONDS caps each target's time
      # (libFuzzer -max_total_time), so a run under a wall-clock limit still ends with its counts.
      [[ -d "$ROOT/.deps/fuzz" ]] || { echo "fuzz: no .deps/fuzz (tools/gpu/bundle-fuzzers.sh, then carry it)"; exit 1; }
      tools/gpu/offline-setup.sh >"$OUT/offline-setup.log" 2>&1 || { tail -5 "$OUT/offline-setup.log"; exit 1; }
      jobs=$(nproc)
      per=$(( (${FUZZ_RUNS:-10000000} + jobs - 1) / jobs ))
      for t in ${FUZZ_TARGETS:-chunk_wire job_spec state_file}; do
        bin="$ROOT/.deps/fuzz/fuzz_$t"
        [[ -x "$bin" ]] || { echo "fuzz: no $bin"; continue; }
        extra=()
        [[ -n ${FUZZ_SECONDS:-} ]] && extra+=(-max_total_time="$FUZZ_SECONDS")
        [[ $t == job_spec ]] && extra+=(-dict="$ROOT/.deps/fuzz/job_spec.dict")
        [[ $t == state_file ]] && extra+=(-close_fd_mask=2)
        mkdir -p "$OUT/fuzz-$t"
        SECONDS=0
        (cd "$OUT/fuzz-$t" && "$bin" -jobs="$jobs" -workers="$jobs" -runs="$per" -rss_limit_mb=2048 "${extra[@]}" \
          "$ROOT/.deps/fuzz/corpus_$t" >/dev/null 2>&1) || true
        done_runs=$(cat "$OUT/fuzz-$t"/fuzz-*.log 2>/dev/null | sed -n 's/^Done \([0-9]*\) runs.*/\1/p' | awk '{s += $1} END {print s + 0}')
        crashes=$(ls "$OUT/fuzz-$t" | grep -c -E '^(crash|leak|timeout|oom)-' || true)
        echo "fuzz_$t: $jobs jobs x $per runs: $done_runs executions done in $SECONDS s, $crashes crash/leak/timeout/oom files"
        grep -h -m1 -E "ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY" "$OUT/fuzz-$t"/fuzz-*.log 2>/dev/null | head -3 || true
        rm -rf "$OUT/fuzz-$t"/fuzz-*.log.gz
      done ;;
    test) ./longhaul.sh test -L gpu 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
          # The CUDA cases of the link's device hand-over (label worker, skipped without a GPU).
          build/tests/worker_test --gtest_filter='DeviceCopyTest.*' 2>&1 | tee "$OUT/device-copy-tests.log" | tail -4 ;;
    bench) nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
           build/bin/longhaul-bench stage --device=cuda:0 --preset=gpt2-xl --layers=12 --precision=bf16 --json \
             | tee "$OUT/stage-bench.json" ;;
    stageprof)
      ./longhaul.sh build longhaul-bench >"$OUT/build-stageprof.log" 2>&1 || { tail -40 "$OUT/build-stageprof.log"; exit 1; }
      nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
      sb=(build/bin/longhaul-bench stage --device=cuda:0 --preset=gpt2-xl --layers=12 --precision=bf16 --json)
      # One JSON line a run in stageprof.jsonl (each names its stage, micro-batch size and context).
      for role in middle first last; do
        flag=""; [[ "$role" != middle ]] && flag="--$role"
        "${sb[@]}" $flag --micro-batch-size=1 --micro-batches=32 --warmup=2 --iters=3 | tee -a "$OUT/stageprof.jsonl"
      done
      "${sb[@]}" --micro-batch-size=8 --micro-batches=4 | tee -a "$OUT/stageprof.jsonl"
      # The GPU's part and the host's: the same micro-batch at 1/8 the context (the host's work the
      # same, the GPU's an eighth), and one iteration of 8 micro-batches under LibTorch's profiler.
      "${sb[@]}" --micro-batch-size=1 --micro-batches=32 --context=128 --warmup=2 --iters=3 | tee -a "$OUT/stageprof.jsonl"
      "${sb[@]}" --micro-batch-size=1 --micro-batches=8 --warmup=2 --iters=3 --trace="$OUT/stage-mb1-trace.json" >/dev/null \
        && python3 tools/torch-trace-summary.py "$OUT/stage-mb1-trace.json" | tee "$OUT/stage-mb1-trace.txt" \
        && gzip -f "$OUT/stage-mb1-trace.json" || { echo "stageprof: the traced run failed"; exit 1; } ;;
    data) ./longhaul.sh build longhaul-data >"$OUT/build-data.log" 2>&1 || { tail -40 "$OUT/build-data.log"; exit 1; }
          build/bin/longhaul-data prepare --input=/usr/share/games/fortunes --out="$DATA" --vocab-size=8000 \
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
