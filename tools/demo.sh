#!/usr/bin/env bash
# The main job (README quick start, `./longhaul.sh demo`): a local coordinator and 4 worker
# processes on this machine train a small GPT over gRPC, TAH-Quant activations forward and INT8
# gradients backward, every link shaped to 100 Mbit/s in-process. Shows the live progress bar and
# ends with a summary (loss, tokens/s, bytes on the wire vs uncompressed, logs, checkpoints).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bin"

usage() {
  cat <<'USAGE'
usage: ./longhaul.sh demo [options]

  --steps N            training steps (default 300, the spec's value)
  --summary-json PATH  also write the summary as JSON (final_train_loss, initial_train_loss,
                       steps, tokens_per_s, wire_bytes, raw_bytes, ...)
  --rate-mbit R        link rate in Mbit/s (default 100; 0 = unshaped)
  --spec FILE          job spec (default deploy/jobs/demo.yaml)
  --run-dir DIR        where logs, the coordinator's state file and checkpoints go
                       (default build/demo-runs/<time>)
  --threads N          LibTorch threads per worker (default 1: 4 workers share this machine)
  --device DEV[,DEV..] where the workers compute: cpu (default), cuda:0, or a list dealt to the
                       workers in turn (cuda:0,cuda:1,...); workers may share a GPU
USAGE
}

steps=0; summary=""; rate=""; spec="$ROOT/deploy/jobs/demo.yaml"; run_dir=""; threads=1; devices="cpu"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --steps=*) steps="${1#*=}"; shift ;;
    --summary-json) summary="$2"; shift 2 ;;
    --summary-json=*) summary="${1#*=}"; shift ;;
    --rate-mbit) rate="$2"; shift 2 ;;
    --rate-mbit=*) rate="${1#*=}"; shift ;;
    --spec) spec="$2"; shift 2 ;;
    --spec=*) spec="${1#*=}"; shift ;;
    --run-dir) run_dir="$2"; shift 2 ;;
    --run-dir=*) run_dir="${1#*=}"; shift ;;
    --threads) threads="$2"; shift 2 ;;
    --threads=*) threads="${1#*=}"; shift ;;
    --device) devices="$2"; shift 2 ;;
    --device=*) devices="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] || { echo "demo: --steps needs a number, got '$steps'" >&2; exit 2; }
[[ -f "$spec" ]] || { echo "demo: no job spec at $spec" >&2; exit 2; }
[[ -z "$summary" || "$summary" = /* ]] || summary="$PWD/$summary"

run_dir="${run_dir:-$ROOT/build/demo-runs/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$run_dir"
job_spec="$run_dir/job.yaml"
cp "$spec" "$job_spec"
if [[ -n "$rate" ]]; then
  [[ "$rate" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "demo: --rate-mbit needs a number" >&2; exit 2; }
  # Replace (or add) links.rate_mbit in the copy.
  if grep -q '^  rate_mbit:' "$job_spec"; then
    sed -i "s/^  rate_mbit:.*/  rate_mbit: $rate/" "$job_spec"
  else
    printf 'links:\n  rate_mbit: %s\n' "$rate" >> "$job_spec"
  fi
fi
if [[ -z "$summary" ]]; then summary="$run_dir/summary.json"; fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted; stopping the daemons" >&2; exit 130' INT TERM

echo "demo: run directory $run_dir"
# Its metrics on a free port (a fixed one may be taken on a shared machine), printed below.
"$BIN/longhaul-coordinator" --listen=127.0.0.1:0 --port-file="$run_dir/coordinator.port" \
  --metrics-listen=127.0.0.1:0 --metrics-port-file="$run_dir/coordinator-metrics.port" \
  --state="$run_dir/coordinator.db" >"$run_dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "$run_dir/coordinator.port" ]] && break; sleep 0.1; done
[[ -s "$run_dir/coordinator.port" ]] || { echo "demo: the coordinator did not start; see $run_dir/coordinator.log" >&2; exit 1; }
addr="127.0.0.1:$(cat "$run_dir/coordinator.port")"
export LONGHAUL_COORDINATOR="$addr"
echo "demo: coordinator on $addr, metrics at http://127.0.0.1:$(cat "$run_dir/coordinator-metrics.port" 2>/dev/null)/metrics (workers: /sd)"

workers=$(sed -n 's/^stages: *\([0-9]*\).*/\1/p' "$job_spec"); workers=${workers:-4}
IFS=, read -r -a device_list <<<"$devices"
for i in $(seq 0 $((workers - 1))); do
  dev="${device_list[$((i % ${#device_list[@]}))]}"
  "$BIN/longhaul-worker" --coordinator="$addr" --listen=127.0.0.1:0 --name="worker-$i" --device="$dev" \
    --region=local --threads="$threads" --data-dir="$run_dir/worker-$i" >"$run_dir/worker-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do
  n=$("$BIN/longhaulctl" workers 2>/dev/null | grep -c IDLE || true)
  [[ "$n" -ge "$workers" ]] && break
  sleep 0.2
done
[[ "${n:-0}" -ge "$workers" ]] || { echo "demo: only ${n:-0} of $workers workers registered; see $run_dir/worker-*.log" >&2; exit 1; }
echo "demo: $workers workers registered"
"$BIN/longhaulctl" workers

set +e
"$BIN/longhaulctl" submit "$job_spec" --steps="$steps" --watch --summary-json="$summary"
rc=$?
set -e
echo "logs:         $run_dir/{coordinator,worker-*}.log"
echo "state file:   $run_dir/coordinator.db"
exit $rc
