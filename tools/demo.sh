#!/usr/bin/env bash
# The main job (README quick start, `./longhaul.sh demo`): a local coordinator and 4 worker
# processes on this machine train a small GPT over gRPC, TAH-Quant activations forward and INT8
# gradients backward, every link shaped to 100 Mbit/s in-process. Shows the live progress bar and
# ends with a summary (loss, tokens/s, bytes on the wire vs uncompressed, logs, checkpoints).
# With --prometheus, Debian's prometheus scrapes the demo too (docs/observability.md). With
# --kill-worker-at STEP a spare worker is started too, one worker is killed (kill -9, its data
# directory deleted) at that step, and the job recovers on the spare (docs/recovery.md). With
# --replicas N every stage runs on N workers whose gradients are synchronised by a data-parallel
# codec (docs/replicated-stages.md): by default 2 stages x N replicas.
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
  --prometheus         also run Debian's prometheus (installed by tools/setup.sh) with
                       dashboards/prometheus.yml pointed at this demo's coordinator (the workers
                       through its /sd discovery); prints its address and the PromQL for loss
                       and tokens/s. It stops when the demo ends; its data stays in
                       RUN_DIR/prometheus-data and the command to browse it again is printed
  --kill-worker-at STEP
                       also start a spare worker; at that step kill -9 the worker of the middle
                       stage and delete its data directory (as if its machine had vanished); the
                       job recovers on the spare from the checkpoint copies and the demo prints
                       how long detection and recovery took (docs/recovery.md). The checkpoint
                       interval becomes 25 steps unless --checkpoint-interval says otherwise
  --checkpoint-interval N
                       checkpoint every N steps (default: the spec's)
  --replicas N         run every stage on N workers (data parallelism inside each stage,
                       docs/replicated-stages.md): the spec's stages become 2 unless --stages
                       says otherwise, so --replicas 2 starts 2 stages x 2 replicas = 4 workers;
                       the step's micro-batches (the spec's micro_batches, a multiple of N) are
                       divided among the replicas. The summary adds the data-parallel bytes per
                       step on the wire against fp32 and the time spent synchronising.
                       A count per stage, e.g. --replicas 2,1: stage 0 on 2 workers streaming to
                       stage 1's one (3 workers; the list sets the number of stages)
  --dp-codec C         how the replicas synchronise: sdp4bit (default), fp32, bitdp1, bitdp2,
                       zeropp
  --stages N           pipeline stages (default: the spec's; 2 with --replicas)
  --regions N          deal the workers to N regions in turn (--region=region-0, region-1, ...;
                       default 1, "local"): placement sees the regions, and replicated stages
                       synchronise in two levels (inside a region, then across)
  --between-regions-mbit R
                       links between workers of different regions (pipeline and data-parallel)
                       at R Mbit/s instead of --rate-mbit (links.between_regions_mbit; needs
                       --regions N >= 2). E.g. --replicas 4 --stages 1 --regions 2
                       --between-regions-mbit 10: 2 regions x 2 replicas over a 10 Mbit/s WAN
  --prometheus-listen HOST:PORT
                       where that prometheus serves (implies --prometheus; default
                       127.0.0.1:9090, or the next free port when 9090 is taken)
USAGE
}

steps=0; summary=""; rate=""; spec="$ROOT/deploy/jobs/demo.yaml"; run_dir=""; threads=1; devices="cpu"
prometheus=0; prom_listen=""; kill_at=0; ckpt_interval=""; replicas=1; dp_codec=""; stages_flag=""
regions=1; between=""
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
    --kill-worker-at) kill_at="$2"; shift 2 ;;
    --kill-worker-at=*) kill_at="${1#*=}"; shift ;;
    --checkpoint-interval) ckpt_interval="$2"; shift 2 ;;
    --checkpoint-interval=*) ckpt_interval="${1#*=}"; shift ;;
    --regions) regions="$2"; shift 2 ;;
    --regions=*) regions="${1#*=}"; shift ;;
    --between-regions-mbit) between="$2"; shift 2 ;;
    --between-regions-mbit=*) between="${1#*=}"; shift ;;
    --replicas) replicas="$2"; shift 2 ;;
    --replicas=*) replicas="${1#*=}"; shift ;;
    --dp-codec) dp_codec="$2"; shift 2 ;;
    --dp-codec=*) dp_codec="${1#*=}"; shift ;;
    --stages) stages_flag="$2"; shift 2 ;;
    --stages=*) stages_flag="${1#*=}"; shift ;;
    --prometheus) prometheus=1; shift ;;
    --prometheus-listen) prometheus=1; prom_listen="$2"; shift 2 ;;
    --prometheus-listen=*) prometheus=1; prom_listen="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[0-9]+$ ]] || { echo "demo: --steps needs a number, got '$steps'" >&2; exit 2; }
[[ "$kill_at" =~ ^[0-9]+$ ]] || { echo "demo: --kill-worker-at needs a step number, got '$kill_at'" >&2; exit 2; }
[[ -z "$ckpt_interval" || "$ckpt_interval" =~ ^[0-9]+$ ]] ||
  { echo "demo: --checkpoint-interval needs a number, got '$ckpt_interval'" >&2; exit 2; }
# --replicas A,B,...: a count per stage (replicas: [A, B, ...] in the spec); $replicas is then the
# largest, for the checks below.
replica_list=""; replica_sum=0
if [[ "$replicas" =~ ^[0-9]+(,[0-9]+)+$ ]]; then
  IFS=, read -r -a replica_counts <<<"$replicas"
  [[ -z "$stages_flag" || "$stages_flag" == "${#replica_counts[@]}" ]] ||
    { echo "demo: --replicas $replicas has ${#replica_counts[@]} counts, one per stage, but --stages is $stages_flag" >&2; exit 2; }
  stages_flag=${#replica_counts[@]}
  replica_list="[${replicas//,/, }]"
  replicas=1
  for n in "${replica_counts[@]}"; do
    ((n >= 1 && n <= 64)) || { echo "demo: every count of --replicas must be in 1..64, got '$n'" >&2; exit 2; }
    ((n > replicas)) && replicas=$n
    replica_sum=$((replica_sum + n))
  done
fi
[[ "$replicas" =~ ^[0-9]+$ ]] && ((replicas >= 1 && replicas <= 64)) ||
  { echo "demo: --replicas needs a number in 1..64 or a count per stage (2,1), got '$replicas'" >&2; exit 2; }
[[ -z "$stages_flag" || "$stages_flag" =~ ^[1-9][0-9]*$ ]] ||
  { echo "demo: --stages needs a number >= 1, got '$stages_flag'" >&2; exit 2; }
case "${dp_codec:-sdp4bit}" in
  fp32|sdp4bit|bitdp1|bitdp2|zeropp) ;;
  *) echo "demo: --dp-codec must be fp32, sdp4bit, bitdp1, bitdp2 or zeropp, got '$dp_codec'" >&2; exit 2 ;;
esac
if [[ -n "$dp_codec" ]] && ((replicas == 1)); then
  echo "demo: --dp-codec is for replicated stages; add --replicas N (N >= 2)" >&2; exit 2
fi
dp_codec="${dp_codec:-sdp4bit}"
if ((kill_at > 0)) && [[ -z "$ckpt_interval" ]]; then ckpt_interval=25; fi
[[ -f "$spec" ]] || { echo "demo: no job spec at $spec" >&2; exit 2; }
[[ -z "$summary" || "$summary" = /* ]] || summary="$PWD/$summary"
if ((prometheus)); then
  command -v prometheus >/dev/null ||
    { echo "demo: --prometheus needs Debian's prometheus package (tools/setup.sh installs it)" >&2; exit 2; }
  [[ -z "$prom_listen" || "$prom_listen" =~ ^[^:]+:[0-9]+$ ]] ||
    { echo "demo: --prometheus-listen needs HOST:PORT, got '$prom_listen'" >&2; exit 2; }
fi

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
[[ "$regions" =~ ^[1-9][0-9]*$ && "$regions" -le 64 ]] ||
  { echo "demo: --regions needs a number in 1..64, got '$regions'" >&2; exit 2; }
if [[ -n "$between" ]]; then
  [[ "$between" =~ ^[0-9]+([.][0-9]+)?$ && ! "$between" =~ ^0+([.]0+)?$ ]] ||
    { echo "demo: --between-regions-mbit needs a rate > 0 in Mbit/s, got '$between'" >&2; exit 2; }
  ((regions > 1)) ||
    { echo "demo: --between-regions-mbit needs --regions N (N >= 2): with one region no link is between regions" >&2; exit 2; }
  # Replace (or add) links.between_regions_mbit in the copy (block-style links only).
  if grep -q '^  between_regions_mbit:' "$job_spec"; then
    sed -i "s/^  between_regions_mbit:.*/  between_regions_mbit: $between/" "$job_spec"
  elif grep -qE '^links:[[:space:]]*$' "$job_spec"; then
    sed -i "s/^links:[[:space:]]*\$/links:\n  between_regions_mbit: $between/" "$job_spec"
  elif grep -q '^links:' "$job_spec"; then
    echo "demo: --between-regions-mbit needs the spec's links: in block style (one key per line)" >&2; exit 2
  else
    printf 'links:\n  between_regions_mbit: %s\n' "$between" >> "$job_spec"
  fi
fi
if [[ -n "$ckpt_interval" ]]; then
  # Replace (or add) checkpoint.interval in the copy.
  if grep -q '^checkpoint:' "$job_spec"; then
    if grep -q '^  interval:' "$job_spec"; then
      sed -i "s/^  interval:.*/  interval: $ckpt_interval/" "$job_spec"
    else
      sed -i "s/^checkpoint:.*/checkpoint:\n  interval: $ckpt_interval/" "$job_spec"
    fi
  else
    printf 'checkpoint:\n  interval: %s\n' "$ckpt_interval" >> "$job_spec"
  fi
fi
if ((replicas > 1)) && [[ -z "$stages_flag" ]]; then stages_flag=2; fi
if [[ -n "$stages_flag" ]]; then
  # Replace (or add) stages in the copy.
  if grep -q '^stages:' "$job_spec"; then
    sed -i "s/^stages:.*/stages: $stages_flag/" "$job_spec"
  else
    printf 'stages: %s\n' "$stages_flag" >> "$job_spec"
  fi
fi
if ((replicas > 1)); then
  mb=$(sed -n 's/^micro_batches: *\([0-9]*\).*/\1/p' "$job_spec" | head -1); mb=${mb:-4}
  for n in ${replica_counts[@]+"${replica_counts[@]}"} $replicas; do
    ((mb % n == 0)) ||
      { echo "demo: the spec's micro_batches ($mb) is not a multiple of $n replicas; the replicas divide them" >&2; exit 2; }
  done
  # Drop the spec's own replicas and data_parallel (block style too: its indented lines).
  awk '/^replicas:/ { next } /^data_parallel:/ { skip = 1; next } skip && /^[ \t]/ { next } { skip = 0; print }' \
    "$job_spec" >"$job_spec.tmp" && mv "$job_spec.tmp" "$job_spec"
  printf 'replicas: %s\ndata_parallel: {codec: %s}\n' "${replica_list:-$replicas}" "$dp_codec" >> "$job_spec"
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

# Whether something accepts connections on HOST PORT.
listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
prom_cmd=""
if ((prometheus)); then
  if [[ -z "$prom_listen" ]]; then  # 9090, or the next free port
    for p in $(seq 9090 9189); do listening 127.0.0.1 "$p" || { prom_listen="127.0.0.1:$p"; break; }; done
  fi
  # dashboards/prometheus.yml with the coordinator's actual metrics address (the demo's is a free
  # port) and quicker worker discovery (short demos).
  mport="$(cat "$run_dir/coordinator-metrics.port")"
  sed -e "s#localhost:9464#127.0.0.1:$mport#g" -e 's#refresh_interval: 15s#refresh_interval: 5s#' \
    "$ROOT/dashboards/prometheus.yml" >"$run_dir/prometheus.yml"
  grep -q "127.0.0.1:$mport/sd" "$run_dir/prometheus.yml" ||
    { echo "demo: dashboards/prometheus.yml no longer names localhost:9464; cannot point it at the demo" >&2; exit 1; }
  prom_args=(--config.file="$run_dir/prometheus.yml" --storage.tsdb.path="$run_dir/prometheus-data"
             --web.listen-address="$prom_listen")
  prom_cmd="prometheus$(printf ' %q' "${prom_args[@]}")"
  prometheus "${prom_args[@]}" >"$run_dir/prometheus.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do listening "${prom_listen%:*}" "${prom_listen##*:}" && break; sleep 0.1; done
  if ! kill -0 "${pids[-1]}" 2>/dev/null || ! listening "${prom_listen%:*}" "${prom_listen##*:}"; then
    echo "demo: prometheus did not start on $prom_listen; see $run_dir/prometheus.log" >&2; exit 1
  fi
  graph="http://$prom_listen/graph?g0.expr=longhaul_job_loss&g0.tab=0&g0.range_input=15m"
  graph+="&g1.expr=longhaul_job_tokens_per_second&g1.tab=0&g1.range_input=15m"
  echo "demo: prometheus on http://$prom_listen (config $run_dir/prometheus.yml, log $run_dir/prometheus.log)"
  echo "demo:   loss (PromQL):     longhaul_job_loss"
  echo "demo:   tokens/s (PromQL): longhaul_job_tokens_per_second"
  echo "demo:   both graphed:      $graph"
fi

stages=$(sed -n 's/^stages: *\([0-9]*\).*/\1/p' "$job_spec"); stages=${stages:-4}
workers=$((stages * replicas))
[[ -n "$replica_list" ]] && workers=$replica_sum
((kill_at > 0)) && workers=$((workers + 1))  # a spare, to take over the killed worker's stage
# The coordinator serves TLS with the cluster CA it created in its PKI directory
# (docs/security.md): longhaulctl uses the admin identity there, and the workers join with a
# token good for all of them (the CA's fingerprint pins the coordinator).
if [[ -d "$run_dir/longhaul-pki" ]]; then
  export LONGHAUL_PKI_DIR="$run_dir/longhaul-pki"
  LONGHAUL_JOIN_TOKEN=$("$BIN/longhaulctl" token create --uses "$workers" 2>"$run_dir/token.log") ||
    { echo "demo: could not make a join token: $(cat "$run_dir/token.log")" >&2; exit 1; }
  LONGHAUL_CA_FINGERPRINT=$(sed -n 's/^CA fingerprint //p' "$run_dir/token.log")
  export LONGHAUL_JOIN_TOKEN LONGHAUL_CA_FINGERPRINT
fi
IFS=, read -r -a device_list <<<"$devices"
declare -A worker_pid
for i in $(seq 0 $((workers - 1))); do
  dev="${device_list[$((i % ${#device_list[@]}))]}"
  region=local; ((regions > 1)) && region="region-$((i % regions))"
  "$BIN/longhaul-worker" --coordinator="$addr" --listen=127.0.0.1:0 --name="worker-$i" --device="$dev" \
    --region="$region" --threads="$threads" --data-dir="$run_dir/worker-$i" >"$run_dir/worker-$i.log" 2>&1 &
  pids+=($!)
  worker_pid["worker-$i"]=$!
done
for _ in $(seq 300); do
  n=$("$BIN/longhaulctl" workers 2>/dev/null | grep -c IDLE || true)
  [[ "$n" -ge "$workers" ]] && break
  sleep 0.2
done
[[ "${n:-0}" -ge "$workers" ]] || { echo "demo: only ${n:-0} of $workers workers registered; see $run_dir/worker-*.log" >&2; exit 1; }
stage_word=stages; ((stages == 1)) && stage_word=stage
layout="$stages $stage_word"
replica_desc="$stage_word x $replicas replicas"
[[ -n "$replica_list" ]] && replica_desc="$stage_word with replicas $replica_list"
((replicas > 1)) && layout="$stages $replica_desc, data-parallel $dp_codec"
((regions > 1)) && layout+=", $regions regions${between:+ (${between} Mbit/s between them)}"
echo "demo: $workers workers registered ($layout$( ((kill_at > 0)) && echo ", 1 spare"))"

# `longhaulctl status JOB --json` (pretty-printed, keys sorted): a top-level number, the worker of
# a stage, a number of the first recovery.
json_top() { sed -n "s/^  \"$1\": \([-0-9.e+]*\),\{0,1\}\$/\1/p" | head -1; }
json_stage_worker() { awk -v s="$1" '$0 ~ "\"stage\": " s "," { f = 1 } f && /"worker":/ { gsub(/.*": "|".*/, ""); print; exit }'; }
json_recovery() { sed -n "s/^      \"$1\": \([-0-9.e+]*\),\{0,1\}\$/\1/p" | head -1; }

kill_worker_demo() {
  local out st step victim t_kill  # (job: global, for dp_summary)
  out=$("$BIN/longhaulctl" submit "$job_spec" --steps="$steps") || return 1
  echo "$out"
  job=$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' <<<"$out")
  "$BIN/longhaulctl" watch "$job" --summary-json="$summary" &
  local watch_pid=$!
  # Kill only while the job is RUNNING at or past the step: once it has left RUNNING (SUCCEEDED,
  # FAILED, RECOVERING on its own) there is nothing to demonstrate and no kill to time.
  local ended=""
  while :; do
    st=$("$BIN/longhaulctl" status "$job" --json 2>/dev/null) || { sleep 0.2; continue; }
    step=$(json_top steps <<<"$st")
    ended=$(sed -n 's/^  "state": "\([A-Z_]*\)".*/\1/p' <<<"$st" | head -1); ended=${ended:-UNKNOWN}
    [[ "$ended" == PENDING ]] && { sleep 0.2; continue; }
    [[ "$ended" == RUNNING ]] || break
    ended=""
    [[ "${step:-0}" -ge "$kill_at" ]] && break
    sleep 0.1
  done
  if [[ -n "$ended" ]]; then
    echo "demo: the job left RUNNING ($ended) at step ${step:-0}, before step $kill_at; nothing was killed" >&2
  elif victim=$(json_stage_worker $((stages / 2)) <<<"$st") && [[ -z "$victim" || -z "${worker_pid[$victim]:-}" ]]; then
    echo "demo: no worker of stage $((stages / 2)) to kill at step $step; nothing was killed" >&2
  else
    t_kill=$(date +%s.%N)
    # (Reaped here, quietly: bash would report the kill in the middle of the progress output.)
    { kill -KILL "${worker_pid[$victim]}"; wait "${worker_pid[$victim]}"; } 2>/dev/null
    rm -rf "$run_dir/$victim"  # its disk is gone too: the spare restores from the copy on a neighbour
    echo >&2
    echo "demo: killed $victim (stage $((stages / 2)), pid ${worker_pid[$victim]}) at step $step and deleted its data directory" >&2
  fi
  wait "$watch_pid"
  local rc=$?
  if [[ -n "${t_kill:-}" ]]; then
    st=$("$BIN/longhaulctl" status "$job" --json)
    local failed resumed recovered restored
    failed=$(json_recovery failed_unix <<<"$st"); resumed=$(json_recovery resumed_unix <<<"$st")
    recovered=$(json_recovery recovered_unix <<<"$st"); restored=$(json_recovery restored_step <<<"$st")
    if [[ -n "$failed" ]]; then
      awk -v k="$t_kill" -v f="$failed" -v r="$resumed" -v t="$recovered" -v s="$step" -v n="$restored" 'BEGIN {
        printf "recovery:     killed at step %d; detected %.3f s after the kill; every stage restarted from step %d %.3f s after the kill", s, f - k, n, r - k
        if (t > 0) printf "; training again %.3f s after the kill", t - k
        printf " (%d steps re-run)\n", s - n }'
    else
      echo "recovery:     the coordinator recorded no recovery (did the job end first?)"
    fi
  fi
  return $rc
}
"$BIN/longhaulctl" workers

# Replicated stages: what the replicas' synchronisation cost (the watch summary shows the links').
dp_summary() {
  ((replicas > 1)) || return 0
  local st dp raw secs
  st=$("$BIN/longhaulctl" status "$1" --json 2>/dev/null) || return 0
  dp=$(json_top dp_bytes_per_step <<<"$st"); raw=$(json_top dp_raw_bytes_per_step <<<"$st")
  secs=$(json_top dp_seconds <<<"$st")
  awk -v d="${dp:-0}" -v r="${raw:-0}" -v t="${secs:-0}" -v l="$replica_desc" -v s="$stages" -v c="$dp_codec" 'BEGIN {
    printf "data-parallel: %d %s, %s: %.1f KB per step on the wire (all replicas) vs %.1f KB as fp32", s, l, c, d / 1e3, r / 1e3
    if (d > 0) printf " (%.2fx)", r / d
    printf "; %.3f s per step synchronising (the slowest replica, last step)\n", t }'
}
job=""  # set by the submit below (dp_summary reads it)
set +e
if ((kill_at > 0)); then
  kill_worker_demo  # below: submit, watch, kill one worker at the step, report the recovery
  rc=$?
  dp_summary "$job"
else
  out=$("$BIN/longhaulctl" submit "$job_spec" --steps="$steps")
  rc=$?
  echo "$out"
  if ((rc == 0)); then
    job=$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' <<<"$out")
    "$BIN/longhaulctl" watch "$job" --summary-json="$summary"
    rc=$?
    dp_summary "$job"
  fi
fi
set -e
echo "logs:         $run_dir/{coordinator,worker-*}.log"
echo "state file:   $run_dir/coordinator.db"
if [[ -n "$prom_cmd" ]]; then
  sleep 6  # one more scrape (every 5 s) of the final values before everything stops
  echo "prometheus:   stops with the demo; its data stays in $run_dir/prometheus-data. To browse it again:"
  echo "              $prom_cmd"
fi
exit $rc
