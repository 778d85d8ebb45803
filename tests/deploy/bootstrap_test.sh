#!/usr/bin/env bash
# deploy/bootstrap.sh, run for real (ctest label deploy; docs/deploy.md).
#   foreground: against a coordinator started here, the script installs this build's binaries into a
#     temporary prefix (--bin-dir: no packages, no build; the suite has just built them), starts the
#     worker in the foreground and must see the coordinator list it IDLE; `longhaulctl workers`
#     confirms it independently; a second run changes nothing; SIGTERM to the script stops the worker
#     cleanly (exit 0, listed DEAD). Also: an unreachable coordinator is an error naming the address.
#   dry-run: the systemd path with --dry-run prints the packages/build/install steps, the unit, the
#     settings file and the systemctl calls, and writes nothing (not even the prefix).
# usage: bootstrap_test.sh SOURCE_DIR BIN_DIR foreground|dry-run
set -euo pipefail
src="$1" bin="$2" what="$3"
boot="$src/deploy/bootstrap.sh"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [[ -f "$f" ]] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
expect() {  # FILE TEXT: the output contains TEXT (a fixed string)
  grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks: $2"
}
wait_for() {  # SECONDS CONDITION...: polls every 0.2 s
  local end=$((SECONDS + $1)); shift
  until "$@"; do ((SECONDS < end)) || return 1; sleep 0.2; done
}

if [[ "$what" == dry-run ]]; then
  state() { for f in /etc/default/longhaul-worker /etc/systemd/system/longhaul-worker.service \
                     /etc/systemd/system/longhaul-worker.service.d; do
              if [[ -e "$f" ]]; then stat -c '%n %Y %s' "$f"; else echo "$f absent"; fi; done; }
  before="$(state)"
  prefix="$tmp/opt/longhaul/bin"
  "$boot" --systemd --dry-run --coordinator coord.example.org:7400 --name gpu-1 --region eu \
    --advertise-host 203.0.113.7 --device cuda --prefix "$prefix" -- --threads 8 >"$tmp/dry.log" 2>&1 ||
    fail "the dry run exited with $?"
  cat "$tmp/dry.log"
  expect "$tmp/dry.log" "dry run: nothing is changed"
  expect "$tmp/dry.log" "would check that the coordinator at coord.example.org:7400 accepts TCP connections"
  grep -qE "would run: env LONGHAUL_NO_VENV=1 bash $src/tools/setup.sh|would run: bash $src/tools/gpu/offline-setup.sh" \
    "$tmp/dry.log" || fail "no package step"
  expect "$tmp/dry.log" "would run: env LONGHAUL_NO_VENV=1 bash $src/longhaul.sh build longhaul-worker longhaulctl"
  expect "$tmp/dry.log" "would run: install -m 0755 $src/build/bin/longhaul-worker $prefix/.longhaul-worker.new"
  expect "$tmp/dry.log" "would write /etc/systemd/system/longhaul-worker.service (mode 0644): deploy/systemd/longhaul-worker.service, running $prefix/longhaul-worker"
  expect "$tmp/dry.log" "would write /etc/default/longhaul-worker (mode 0600):"
  expect "$tmp/dry.log" "LONGHAUL_COORDINATOR=coord.example.org:7400"
  expect "$tmp/dry.log" "LONGHAUL_LISTEN=0.0.0.0:7401"
  expect "$tmp/dry.log" "LONGHAUL_DEVICE=cuda"
  expect "$tmp/dry.log" "LONGHAUL_WORKER_FLAGS=\"--name=gpu-1 --region=eu --advertise-host=203.0.113.7 --probe-listen=0.0.0.0:7402 --threads 8\""
  expect "$tmp/dry.log" "would run: systemctl enable --quiet longhaul-worker"
  expect "$tmp/dry.log" "would run: systemctl restart longhaul-worker"
  expect "$tmp/dry.log" "bootstrap: dry run done"
  [[ "$(state)" == "$before" ]] || fail "the dry run changed /etc: $(diff <(echo "$before") <(state))"
  [[ ! -e "$tmp/opt" ]] || fail "the dry run created $tmp/opt"
  # The CLI's promises: --help exits 0 and names the token flags; a token needs the CA's
  # fingerprint; the settings file takes both, and a dry run does not print the token.
  "$boot" --help >"$tmp/help.log" || fail "--help exited with $?"
  expect "$tmp/help.log" "--join-token TOKEN"
  expect "$tmp/help.log" "--ca-fingerprint sha256:HEX"
  if "$boot" --coordinator x:1 --join-token abc >"$tmp/token.log" 2>&1; then fail "--join-token without a fingerprint was accepted"; fi
  expect "$tmp/token.log" "--join-token needs --ca-fingerprint"
  "$boot" --systemd --dry-run --coordinator coord.example.org:7400 --prefix "$prefix" --join-token s3cr3t-t0ken \
    --ca-fingerprint sha256:00ff >"$tmp/dry-token.log" 2>&1 || fail "the dry run with a token exited with $?"
  expect "$tmp/dry-token.log" "LONGHAUL_CA_FINGERPRINT=sha256:00ff"
  expect "$tmp/dry-token.log" "LONGHAUL_JOIN_TOKEN=(the token, not shown)"
  if grep -q s3cr3t-t0ken "$tmp/dry-token.log"; then fail "the dry run printed the join token"; fi
  if "$boot" --systemd --data-dir /x --coordinator x:1 --dry-run >"$tmp/dd.log" 2>&1; then fail "--systemd --data-dir was accepted"; fi
  expect "$tmp/dd.log" "--data-dir is for --foreground"
  echo "PASS: dry run of the systemd path"
  exit 0
fi

[[ "$what" == foreground ]] || { echo "usage: $0 SOURCE_DIR BIN_DIR foreground|dry-run"; exit 2; }
for b in longhaul-coordinator longhaul-worker longhaulctl; do [[ -x "$bin/$b" ]] || fail "no $bin/$b"; done
"$bin/longhaul-coordinator" --listen=127.0.0.1:0 --port-file="$tmp/port" --state="$tmp/state.db" \
  --metrics-listen=none >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
wait_for 20 test -s "$tmp/port" || fail "the coordinator did not start"
coord="127.0.0.1:$(cat "$tmp/port")"
# TLS (the coordinator's default): this test is the cluster's admin (the coordinator's --pki-dir,
# next to its state file), and the worker joins with a token and the CA's fingerprint.
export LONGHAUL_PKI_DIR="$tmp/longhaul-pki"
ctl() { "$bin/longhaulctl" --coordinator="$coord" "$@"; }
token="$(ctl token create --uses=1 --ttl=10m 2>"$tmp/token.log")" || fail "token create: $(cat "$tmp/token.log")"
fingerprint="$(sed -n 's/^CA fingerprint //p' "$tmp/token.log")"
[[ -n "$token" && "$fingerprint" == sha256:* ]] || fail "no token or fingerprint: $(cat "$tmp/token.log")"
common=(--foreground --bin-dir "$bin" --prefix "$tmp/prefix/bin" --data-dir "$tmp/data" --listen 127.0.0.1:0
        --metrics-listen none --probe-listen none --name deploy-test-worker --device cpu --wait 60
        --join-token "$token" --ca-fingerprint "$fingerprint")

# No coordinator there: a clear error naming the address, before anything is installed.
if "$boot" "${common[@]}" --coordinator 127.0.0.1:1 >"$tmp/unreachable.log" 2>&1; then fail "ran without a coordinator"; fi
expect "$tmp/unreachable.log" "no coordinator reachable at 127.0.0.1:1"
[[ ! -e "$tmp/prefix" ]] || fail "installed although the coordinator is unreachable"

t0=$SECONDS
"$boot" "${common[@]}" --coordinator "$coord" -- --threads 1 >"$tmp/bootstrap.log" 2>&1 &
boot_pid=$!
pids+=("$boot_pid")
registered() { grep -qs "bootstrap: worker registered" "$tmp/bootstrap.log" || ! kill -0 "$boot_pid" 2>/dev/null; }
wait_for 90 registered || fail "no registration within 90 s"
kill -0 "$boot_pid" 2>/dev/null || fail "the bootstrap script exited"
cat "$tmp/bootstrap.log"
expect "$tmp/bootstrap.log" "lists it as IDLE"
if grep -q -- "$token" "$tmp/bootstrap.log"; then fail "the output shows the join token"; fi
row="$(ctl workers | awk '$2 == "deploy-test-worker"')"
echo "longhaulctl workers: $row"
[[ "$(awk '{print $5}' <<<"$row")" == IDLE ]] || fail "longhaulctl workers does not list deploy-test-worker IDLE: '$row'"
for b in longhaul-worker longhaulctl; do cmp -s "$bin/$b" "$tmp/prefix/bin/$b" || fail "$b not installed"; done
worker_pid="$(sed -n 's/.*worker started (pid \([0-9]*\)).*/\1/p' "$tmp/bootstrap.log")"
[[ -n "$worker_pid" ]] && kill -0 "$worker_pid" || fail "no running worker pid in the output"
echo "registered after $((SECONDS - t0)) s"

# Again: everything is in place already.
"$boot" --install-only --bin-dir "$bin" --prefix "$tmp/prefix/bin" >"$tmp/again.log" 2>&1 || fail "second run exited with $?"
[[ "$(grep -c ': up to date' "$tmp/again.log")" == 2 ]] || fail "second run changed something: $(cat "$tmp/again.log")"

# SIGTERM to the script stops the worker cleanly and ends the script with the worker's status (0).
kill -TERM "$boot_pid"
rc=0; wait "$boot_pid" || rc=$?
[[ $rc == 0 ]] || fail "the bootstrap script exited with $rc after SIGTERM"
expect "$tmp/bootstrap.log" "worker exited with status 0"
! kill -0 "$worker_pid" 2>/dev/null || fail "the worker (pid $worker_pid) still runs"
state="$(ctl workers | awk '$2 == "deploy-test-worker" {print $5}')"
[[ "$state" == DEAD ]] || fail "after the stop the coordinator lists the worker as '$state', not DEAD"
echo "PASS: bootstrap --foreground registered the worker IDLE and stopped it cleanly"
