#!/usr/bin/env bash
# One command from a fresh machine (Debian 12, Ubuntu 22.04/24.04, GPU or CPU; or a CUDA+PyTorch
# container) to a longhaul worker registered with a coordinator: checks, packages, build, install,
# start (systemd service or foreground), and a check that the coordinator lists the worker.
# docs/deploy.md walks through it; `deploy/bootstrap.sh --help` lists the options.
# Idempotent: a step whose result is already there does nothing (apt installs only what is missing,
# the build is incremental, an identical binary or settings file is not rewritten, an unchanged
# running service is not restarted).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UNIT=longhaul-worker
UNIT_SRC="$ROOT/deploy/systemd/$UNIT.service"
UNIT_DST="/etc/systemd/system/$UNIT.service"
DROPIN="/etc/systemd/system/$UNIT.service.d/bootstrap.conf"
ENV_FILE="/etc/default/$UNIT"
OFFLINE_DEBS="$ROOT/.deps/gpu/debs"
OFFLINE_LIB="$ROOT/.deps/gpu-prefix/usr/lib/x86_64-linux-gnu"
LOGDIR="${TMPDIR:-/tmp}/longhaul-bootstrap"

usage() {
  cat <<'USAGE'
usage: deploy/bootstrap.sh --coordinator HOST:PORT [options] [-- WORKER_FLAGS...]

Turns this machine into a longhaul worker that the coordinator lists, in one command, run from a
longhaul source tree (as root, or with sudo, unless --prefix/--bin-dir/--data-dir make it needless).
For Debian 12 and Ubuntu 22.04/24.04 (x86_64), with an NVIDIA driver or CPU only, and for
CUDA+PyTorch containers (deploy/Dockerfile); docs/deploy.md says where it has run. Steps, each
skipped when its result is there already:
  1 check     OS, GPUs (nvidia-smi), PyTorch, systemd; the coordinator accepts TCP connections
  2 packages  what the build lacks: with apt (tools/setup.sh; no Python venv), or, on a machine
              without a package registry, from the .deb files in .deps/gpu
              (tools/gpu/offline-setup.sh)
  3 build     longhaul-worker and longhaulctl only, incrementally, in build/ (./longhaul.sh build)
  4 install   both binaries into --prefix (and, after an offline build, its libraries into
              PREFIX/../lib/longhaul); checks that every shared library they need is found
  5 start     the systemd service, or the worker in the foreground of this script
  6 verify    waits until the coordinator accepts the worker's registration, and prints its row
              of `longhaulctl workers` where longhaulctl has an identity here ($LONGHAUL_PKI_DIR,
              or an admin's files: docs/security.md)

What runs the worker (default: --systemd where systemd runs this machine, else --foreground):
  --systemd              install /etc/systemd/system/longhaul-worker.service (deploy/systemd/),
                         write the settings below to /etc/default/longhaul-worker, enable the
                         service and (re)start it when a binary or a setting changed
  --foreground           run the worker as a child of this script until SIGTERM/SIGINT, which stop
                         it cleanly (containers); exits with the worker's status
  --install-only         stop after step 4 (image builds); no coordinator needed

Worker settings (passed to longhaul-worker, or with --systemd kept in /etc/default/longhaul-worker):
  --coordinator HOST:PORT  the coordinator, which this worker dials (TCP, outbound); required
                           unless --install-only
  --name NAME            unique among live workers (default: longhaul-worker's, HOSTNAME-PORT)
  --region NAME          placement label (default: longhaul-worker's, local)
  --device DEV           cpu, cuda or cuda:N (default: cuda when nvidia-smi lists a GPU, else cpu)
  --listen HOST:PORT     data plane: the other workers (neighbour stages, checkpoint copies)
                         connect here (default 0.0.0.0:7401)
  --advertise-host HOST  the address other workers reach this one at (default, when --listen's
                         host is 0.0.0.0: this machine's address on the route to the coordinator,
                         or nothing, i.e. 127.0.0.1, for a coordinator on this machine). Behind
                         NAT: the public address, with the listen and probe ports forwarded here
  --probe-listen HOST:PORT|none  link probes from the other workers (default: the listen host and
                         the listen port + 1, 7402; a free port with --listen port 0; none: off)
  --metrics-listen HOST:PORT|none  Prometheus /metrics (default: longhaul-worker's, 0.0.0.0:9465)
  --data-dir DIR         checkpoints, with --foreground (default /var/lib/longhaul-worker, which is
                         also where the service keeps them)
  -- WORKER_FLAGS...     more longhaul-worker flags, passed as they are (longhaul-worker --help)
  --join-token TOKEN     join the cluster with a token from `longhaulctl token create` (the worker
                         gets its certificate and keeps it in its data directory); passed in the
                         environment, and with --systemd kept in the 0600 settings file, never on a
                         command line ($LONGHAUL_JOIN_TOKEN is read too)
  --ca-fingerprint sha256:HEX  the cluster CA's fingerprint, printed by the coordinator at start-up
                         and by `longhaulctl token create`: the worker trusts the coordinator only
                         if its CA has it; needed with --join-token ($LONGHAUL_CA_FINGERPRINT too)
  --insecure             plaintext, for a coordinator started with --insecure (loopback only)

Other options:
  --prefix DIR           where the binaries go (default /usr/local/bin)
  --bin-dir DIR          take longhaul-worker and longhaulctl from DIR (e.g. build/bin, or an
                         image's /usr/local/bin) instead of steps 2 and 3
  --wait SECONDS         how long step 6 waits for the registration (default 90)
  --no-verify            skip the coordinator checks of steps 1 and 6 (the worker keeps retrying
                         until its coordinator is up)
  --any-os               go on on an OS other than those three, or another architecture
  --dry-run              print what would be done (commands; files, the settings with their
                         content); change nothing, start nothing, contact nothing
  -h, --help             this text

Ports: the worker dials the coordinator (its --listen, 7400 by default); it accepts TCP from the
other workers on the listen (7401) and probe (7402) ports, and from Prometheus on 9465. Logs of
the long steps: $TMPDIR/longhaul-bootstrap/ (/tmp by default). docs/deploy.md has the whole story.
USAGE
}

say() { printf 'bootstrap: %s\n' "$*"; }
note() { printf '  %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (--help)"; }

coord="" name="" region="" device="" listen="0.0.0.0:7401" advertise="" probe="" metrics="" data_dir=""
prefix="/usr/local/bin" bin_dir="" wait_s=90 verify=1 any_os=0 dry=0 mode="" extra=()
join_token="${LONGHAUL_JOIN_TOKEN:-}" ca_fp="${LONGHAUL_CA_FINGERPRINT:-}" insecure=0
while [[ $# -gt 0 ]]; do
  opt="$1"
  case "$opt" in
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
  esac
  case "$opt" in
    --coordinator) need_value "$@"; coord="$2"; shift 2 ;;
    --name) need_value "$@"; name="$2"; shift 2 ;;
    --region) need_value "$@"; region="$2"; shift 2 ;;
    --device) need_value "$@"; device="$2"; shift 2 ;;
    --listen) need_value "$@"; listen="$2"; shift 2 ;;
    --advertise-host) need_value "$@"; advertise="$2"; shift 2 ;;
    --probe-listen) need_value "$@"; probe="$2"; shift 2 ;;
    --metrics-listen) need_value "$@"; metrics="$2"; shift 2 ;;
    --data-dir) need_value "$@"; data_dir="$2"; shift 2 ;;
    --prefix) need_value "$@"; prefix="${2%/}"; shift 2 ;;
    --bin-dir) need_value "$@"; bin_dir="${2%/}"; shift 2 ;;
    --wait) need_value "$@"; wait_s="$2"; shift 2 ;;
    --join-token) need_value "$@"; join_token="$2"; shift 2 ;;
    --ca-fingerprint) need_value "$@"; ca_fp="$2"; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --systemd|--foreground|--install-only)
      [[ -z "$mode" || "$mode" == "${opt#--}" ]] || die "--$mode and $opt exclude each other"
      mode="${opt#--}"; shift ;;
    --no-verify) verify=0; shift ;;
    --any-os) any_os=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$opt' (--help lists them; worker flags go after --)" ;;
  esac
done

# ---- argument checks (cheap, before anything is done) ----
[[ "$wait_s" =~ ^[0-9]+$ ]] || die "--wait needs a number of seconds, got '$wait_s'"
[[ "$prefix" == /* ]] || prefix="$PWD/$prefix"
[[ -z "$bin_dir" || "$bin_dir" == /* ]] || bin_dir="$PWD/$bin_dir"
[[ -z "$data_dir" || "$data_dir" == /* ]] || data_dir="$PWD/$data_dir"
if [[ -z "$mode" ]]; then
  if [[ -d /run/systemd/system ]]; then mode=systemd; else mode=foreground; fi
  mode_why=" (default: systemd $([[ $mode == systemd ]] && echo runs || echo "does not run") this machine)"
else
  mode_why=""
fi
if [[ "$mode" != install-only ]]; then
  [[ -n "$coord" ]] || die "--coordinator HOST:PORT is required (the coordinator this worker joins)"
  [[ -z "$join_token" || -n "$ca_fp" ]] ||
    die "--join-token needs --ca-fingerprint sha256:HEX (the coordinator prints it at start-up; so does \`longhaulctl token create\`)"
  [[ -z "$join_token" || $insecure -eq 0 ]] || die "--join-token and --insecure exclude each other"
  [[ "$coord" == ?*:* && "${coord##*:}" =~ ^[0-9]+$ ]] || die "--coordinator needs HOST:PORT, got '$coord'"
  [[ "$listen" == *:* && "${listen##*:}" =~ ^[0-9]+$ ]] || die "--listen needs HOST:PORT, got '$listen'"
fi
[[ "$mode" != systemd || -z "$data_dir" ]] ||
  die "--data-dir is for --foreground: the service keeps its checkpoints in /var/lib/longhaul-worker"
# Values end up in /etc/default/longhaul-worker, where systemd splits flags on white space.
for v in "$coord" "$name" "$region" "$device" "$listen" "$advertise" "$probe" "$metrics" "${extra[@]}"; do
  [[ "$v" != *[[:space:]\"\'\\\$]* ]] || die "'$v': values with spaces, quotes, backslashes or \$ are not supported"
done
coord_host="${coord%:*}" coord_host="${coord_host#[}" coord_host="${coord_host%]}" coord_port="${coord##*:}"
listen_host="${listen%:*}" listen_port="${listen##*:}"

((dry)) && say "dry run: nothing is changed, started or contacted"
quoted() { local q; q="$(printf '%q ' "$@")"; printf '%s' "${q% }"; }
run() {  # a command that changes the machine: printed instead under --dry-run
  if ((dry)); then note "would run: $(quoted "$@")"; else "$@"; fi
}
SUDO=()
[[ $EUID -eq 0 ]] || { command -v sudo >/dev/null && SUDO=(sudo); }
as_root() {
  [[ $EUID -eq 0 || ${#SUDO[@]} -gt 0 || $dry -eq 1 ]] || die "needs root: $* (run as root, or install sudo)"
  run "${SUDO[@]}" "$@"
}

# Signals: a long step's child is stopped with us; a foreground worker is stopped cleanly and waited for.
CHILD="" WORKER="" STOPPING=0
# (No `return` in here: bash 5.2 ends the script when a trap's function returns during `wait`.)
on_signal() {
  STOPPING=1
  if [[ -n "$WORKER" ]]; then
    say "$1: stopping the worker (pid $WORKER)"
    kill -TERM "$WORKER" 2>/dev/null || true
  else
    [[ -z "$CHILD" ]] || kill -TERM "$CHILD" 2>/dev/null || true
    say "$1: interrupted"
    if [[ "$1" == INT ]]; then exit 130; else exit 143; fi
  fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

case "$mode" in install-only) NSTEPS=4 ;; *) NSTEPS=$((verify ? 6 : 5)) ;; esac
STEP=0
step() { STEP=$((STEP + 1)); printf '\n[%d/%d] %s\n' "$STEP" "$NSTEPS" "$*"; }

# Runs a long command with its output in a log file, showing the elapsed time and the log's last
# line (every second on a terminal, every 15 s otherwise); on failure, the log's tail.
long_step() {
  local label="$1" log="$2"; shift 2
  if ((dry)); then note "would run: $(quoted "$@") (log: $log)"; return; fi
  mkdir -p "$(dirname "$log")"
  local t0=$SECONDS shown=$SECONDS rc=0 tty=0 line
  [[ -t 1 ]] && tty=1
  note "$label (log: $log)"
  "$@" >"$log" 2>&1 </dev/null &
  CHILD=$!
  while kill -0 "$CHILD" 2>/dev/null; do
    sleep 1
    if ((tty || SECONDS - shown >= 15)); then
      shown=$SECONDS
      line="$(tail -c 4000 "$log" | tr '\r' '\n' | grep -v '^[[:space:]]*$' | tail -1 | cut -c1-90 || true)"
      if ((tty)); then printf '\r\033[K  ... %ds  %s' $((SECONDS - t0)) "$line"; else note "... $((SECONDS - t0)) s  $line"; fi
    fi
  done
  wait "$CHILD" || rc=$?
  CHILD=""
  ((tty)) && printf '\r\033[K'
  if ((rc != 0)); then
    tail -25 "$log" | sed 's/^/  | /' >&2
    die "$label failed (exit $rc); the whole log is $log"
  fi
  note "done in $((SECONDS - t0)) s"
}

# ---- 1. check ----
step "check this machine"
os="unknown"
if [[ -r /etc/os-release ]]; then
  os="$(. /etc/os-release && echo "${ID:-}-${VERSION_ID:-}")"
  note "OS: $(. /etc/os-release && echo "${PRETTY_NAME:-$os}"), $(uname -m)"
fi
case "$os-$(uname -m)" in
  debian-12-x86_64|ubuntu-22.04-x86_64|ubuntu-24.04-x86_64) ;;
  *) ((any_os)) || die "made for Debian 12 and Ubuntu 22.04/24.04 (x86_64); this is $os on $(uname -m) (--any-os goes on anyway)"
     note "warning: untested OS, going on (--any-os)" ;;
esac
in_container=no
if [[ -f /.dockerenv || -f /run/.containerenv ]] || grep -qaE 'docker|containerd|kubepods|lxc' /proc/1/cgroup 2>/dev/null; then
  in_container=yes
fi
note "container: $in_container; systemd: $([[ -d /run/systemd/system ]] && echo running || echo "not running")"
gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus="$(nvidia-smi -L | grep -c '^GPU' || true)"
  note "GPUs: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | paste -sd, -)), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
else
  note "GPUs: none (no working nvidia-smi)"
fi
if [[ -z "$bin_dir" ]]; then
  torch="$(python3 -c 'import torch; print(torch.__version__, "with CUDA", torch.version.cuda or "none")' 2>/dev/null || true)"
  note "PyTorch: ${torch:-"not importable (the build uses Debian's CPU-only libtorch-dev)"}"
fi
if [[ -z "$device" ]]; then
  if ((gpus > 0)); then device=cuda; else device=cpu; fi
  device_why=" (default: $gpus GPU(s))"
else
  device_why=""
fi
[[ "$device" =~ ^(cpu|cuda|cuda:[0-9]+)$ ]] || die "--device needs cpu, cuda or cuda:N, got '$device'"
[[ "$device" == cpu || $gpus -gt 0 ]] || note "warning: --device=$device, but nvidia-smi lists no GPU"
note "mode: $mode$mode_why; device: $device$device_why"

if [[ -n "$bin_dir" ]]; then
  pkg_source="none: binaries from $bin_dir"
elif compgen -G "$OFFLINE_DEBS/*.deb" >/dev/null &&
     [[ "$(dpkg-query -W -f='${Status}' libgrpc++-dev 2>/dev/null)" != "install ok installed" ]]; then
  # The same rule as ./longhaul.sh: .deb files carried in and gRPC not installed = no registry.
  pkg_source="offline: .deb files in .deps/gpu/debs"
elif command -v apt-get >/dev/null; then
  pkg_source="apt"
else
  die "no apt-get and no .deb files in $OFFLINE_DEBS: cannot install the build's dependencies (docs/gpu.md, offline machines; or --bin-dir with built binaries)"
fi
note "packages: $pkg_source"
[[ -n "$bin_dir" || -x "$ROOT/longhaul.sh" ]] || die "$ROOT is not a longhaul source tree (no longhaul.sh): run the script from a checkout, or give --bin-dir"

# Defaults that depend on the network: the address the other workers dial, and the probe port.
if [[ "$mode" != install-only ]]; then
  if [[ -z "$advertise" && "$listen_host" =~ ^(|0\.0\.0\.0|\[::\])$ ]]; then
    coord_ip="$coord_host"
    if [[ ! "$coord_ip" =~ ^[0-9.]+$ ]] && ! ((dry)); then
      coord_ip="$(getent ahostsv4 "$coord_host" 2>/dev/null | awk 'NR == 1 {print $1}' || true)"
    fi
    if [[ "$coord_host" == localhost || "$coord_ip" == 127.* || "$coord_host" == ::1 ]]; then
      note "advertised address: 127.0.0.1 (the coordinator is on this machine)"
    elif ((dry)) && [[ ! "$coord_ip" =~ ^[0-9.]+$ ]]; then
      note "advertised address: would be this machine's address on the route to $coord_host (--advertise-host sets it)"
    else
      [[ -n "$coord_ip" ]] || die "cannot resolve the coordinator's host name '$coord_host'"
      advertise="$(ip -o route get "$coord_ip" 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' || true)"
      [[ -n "$advertise" ]] || advertise="$(hostname -I 2>/dev/null | awk '{print $1}')"
      [[ -n "$advertise" ]] || die "cannot tell this machine's address: give --advertise-host"
      note "advertised address: $advertise (the route to $coord_ip; --advertise-host overrides it)"
      if [[ "$advertise" =~ ^(10\.|192\.168\.|172\.(1[6-9]|2[0-9]|3[01])\.|100\.(6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7])\.) ]]; then
        note "note: $advertise is a private address: if other workers are outside this network (NAT),"
        note "      give --advertise-host PUBLIC_ADDRESS and forward ports $listen_port and $((listen_port + 1)) here"
      fi
    fi
  fi
  if [[ -z "$probe" && "$listen_port" != 0 ]]; then probe="${listen_host}:$((listen_port + 1))"; fi
  if ((verify)); then
    if ((dry)); then
      note "would check that the coordinator at $coord accepts TCP connections"
    else
      err="$(timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$coord_host" "$coord_port" 2>&1)" || {
        rc=$?
        ((rc == 124)) && err="no answer within 5 s (a firewall dropping packets, or a wrong address?)"
        die "no coordinator reachable at $coord: ${err##*: } (is longhaul-coordinator running there, and its port $coord_port open to this machine? --no-verify goes on without it)"
      }
      note "coordinator: $coord accepts TCP connections"
    fi
  fi
fi

# ---- 2. packages, 3. build ----
if [[ -n "$bin_dir" ]]; then
  step "packages: skipped (--bin-dir)"
  step "build: skipped (--bin-dir $bin_dir)"
  src_bin="$bin_dir"
else
  step "packages"
  if [[ "$pkg_source" == apt ]]; then
    long_step "installing what is missing with apt (tools/setup.sh)" "$LOGDIR/packages.log" \
      env LONGHAUL_NO_VENV=1 bash "$ROOT/tools/setup.sh"
  else
    long_step "unpacking .deps/gpu (tools/gpu/offline-setup.sh)" "$LOGDIR/packages.log" \
      bash "$ROOT/tools/gpu/offline-setup.sh"
  fi
  ((dry)) || grep -E '^(setup|offline-setup): ' "$LOGDIR/packages.log" | sed 's/^/  /' || true
  step "build longhaul-worker and longhaulctl (in $ROOT/build)"
  long_step "building" "$LOGDIR/build.log" \
    env LONGHAUL_NO_VENV=1 bash "$ROOT/longhaul.sh" build longhaul-worker longhaulctl
  src_bin="$ROOT/build/bin"
fi
if ! ((dry)); then
  for b in longhaul-worker longhaulctl; do
    [[ -x "$src_bin/$b" ]] || die "$src_bin/$b does not exist or is not executable"
  done
fi

# ---- 4. install ----
step "install into $prefix"
CHANGED=0
libdir="$( [[ "$prefix" == */bin ]] && echo "${prefix%/bin}/lib/longhaul" || echo "$prefix/lib/longhaul")"
priv=run  # as root only where this user cannot write
parent="$prefix"; while [[ ! -e "$parent" ]]; do parent="$(dirname "$parent")"; done
[[ -w "$parent" ]] || priv=as_root
[[ -d "$prefix" ]] || $priv mkdir -p "$prefix"
for b in longhaul-worker longhaulctl; do
  if [[ "$src_bin/$b" -ef "$prefix/$b" ]]; then
    note "$prefix/$b: in place"
  elif cmp -s "$src_bin/$b" "$prefix/$b"; then
    note "$prefix/$b: up to date"
  else
    # Next to the old one, then renamed over it: a running worker keeps its file (no "text file busy").
    $priv install -m 0755 "$src_bin/$b" "$prefix/.$b.new"
    $priv mv -f "$prefix/.$b.new" "$prefix/$b"
    ((dry)) || note "$prefix/$b: installed ($(du -h "$prefix/$b" | cut -f1))"
    CHANGED=1
  fi
done
if [[ "$pkg_source" == offline* ]]; then
  # Built against the unpacked .deb libraries, which are not in the loader's path: copy them.
  note "libraries of the offline build -> $libdir"
  $priv mkdir -p "$libdir"
  $priv cp -a -u "$OFFLINE_LIB/." "$libdir/"
fi
rt_ld=""
[[ -d "$libdir" ]] && rt_ld="$libdir"
if ! ((dry)); then
  # The service starts with a clean environment; the foreground worker inherits this one.
  ld_env="$rt_ld"
  [[ "$mode" == systemd ]] || ld_env="$rt_ld${LD_LIBRARY_PATH:+${rt_ld:+:}$LD_LIBRARY_PATH}"
  libs="$(LD_LIBRARY_PATH="$ld_env" ldd "$prefix/longhaul-worker" "$prefix/longhaulctl" 2>&1)"
  missing="$(grep 'not found' <<<"$libs" | awk '{print $1}' | sort -u | paste -sd' ' - || true)"
  [[ -z "$missing" ]] || die "the installed binaries miss shared libraries: $missing (LD_LIBRARY_PATH=${ld_env:-empty})"
  note "shared libraries: all $(grep -c '=>' <<<"$libs") found"
  home_libs="$(grep -oE '=> /(home|root|run/user)/[^ ]*' <<<"$libs" | head -1 | cut -c4- || true)"
  [[ "$prefix" != /home/* && "$prefix" != /root/* ]] || home_libs="$prefix/longhaul-worker"
fi
if [[ "$mode" == install-only ]]; then
  say "installed; start a worker with: $prefix/longhaul-worker --coordinator HOST:PORT (or this script with --bin-dir $prefix)"
  exit 0
fi

# The worker's flags: on the command line (foreground) or in the settings file (systemd).
named=()
[[ -n "$name" ]] && named+=("--name=$name")
[[ -n "$region" ]] && named+=("--region=$region")
[[ -n "$advertise" ]] && named+=("--advertise-host=$advertise")
[[ -n "$probe" ]] && named+=("--probe-listen=$probe")
((insecure)) && named+=("--insecure")
wflags=("--coordinator=$coord" "--listen=$listen" "--device=$device")
[[ -n "$metrics" ]] && wflags+=("--metrics-listen=$metrics")
wflags+=("${named[@]}" "${extra[@]}")
ctl_flags=()
((insecure)) && ctl_flags+=("--insecure")
ctl() { timeout 15 "$prefix/longhaulctl" --coordinator="$coord" "${ctl_flags[@]}" "$@"; }

# Waits for "registered as worker N" in the worker's log (LOG_CMD prints it), then for the
# coordinator's row of worker N. ALIVE_CMD fails once the worker is gone for good. Returns 1 when
# the worker is gone (or we are stopping), 2 after --wait seconds without a registration.
verify_registration() {
  local log_cmd="$1" alive_cmd="$2" deadline=$((SECONDS + wait_s)) id row state shown=$SECONDS
  while ((SECONDS < deadline)); do
    ((STOPPING)) && return 1
    id="$($log_cmd 2>/dev/null | sed -n 's/.*: registered as worker \([0-9][0-9]*\).*/\1/p' | tail -1 || true)"
    if [[ -n "$id" ]]; then
      if ! listed="$(ctl workers 2>&1)"; then
        # With TLS, listing workers takes an admin or read-only identity, which a rented box
        # usually lacks: the coordinator's acceptance in the worker's log is the evidence then.
        say "worker registered: the coordinator at $coord accepted it as worker $id (\`longhaulctl workers\` is not possible here: $(head -1 <<<"$listed"))"
        return 0
      fi
      row="$(awk -v id="$id" 'NR == 1 || $1 == id' <<<"$listed" || true)"
      state="$(awk -v id="$id" '$1 == id {print $5}' <<<"$row")"
      if [[ -n "$state" && "$state" != DEAD ]]; then
        say "worker registered: the coordinator at $coord lists it as $state"
        sed 's/^/  /' <<<"$row"
        return 0
      fi
    fi
    $alive_cmd || return 1
    if ((SECONDS - shown >= 15)); then shown=$SECONDS; note "... waiting for the registration ($((deadline - SECONDS)) s left)"; fi
    sleep 1
  done
  $log_cmd 2>/dev/null | tail -5 | sed 's/^/  | /' >&2
  say "error: the worker did not register with $coord within $wait_s s (its last lines above; --wait sets the time)" >&2
  return 2
}

# ---- 5. start, 6. verify ----
if [[ "$mode" == systemd ]]; then
  step "start the systemd service $UNIT"
  command -v systemctl >/dev/null || die "--systemd needs systemctl (use --foreground)"
  if [[ ! -d /run/systemd/system ]]; then
    ((dry)) || die "systemd does not run this machine (a container?): use --foreground"
    note "note: systemd does not run this machine: the real run would stop here (use --foreground)"
  fi
  # Writes FILE (mode MODE) when its content differs; under --dry-run prints it, or WHAT it is.
  put_file() {
    local file="$1" mode="$2" content="$3" what="${4:-}"
    if [[ -f "$file" ]] && cmp -s "$file" <(printf '%s\n' "$content"); then note "$file: unchanged"; return 1; fi
    if ((dry)); then
      if [[ -n "$what" ]]; then note "would write $file (mode $mode): $what"; else
        note "would write $file (mode $mode):"; printf '%s\n' "$content" | sed 's/^/      /'; fi
      return 0
    fi
    as_root install -d -m 0755 "$(dirname "$file")"
    printf '%s\n' "$content" | "${SUDO[@]}" install -m "$mode" /dev/stdin "$file"
    note "$file: written"
  }
  reload=0
  unit="$(sed "s#/usr/local/bin/#$prefix/#g" "$UNIT_SRC")"
  what="deploy/systemd/$UNIT.service"
  [[ "$prefix" == /usr/local/bin ]] || what+=", running $prefix/longhaul-worker"
  put_file "$UNIT_DST" 0644 "$unit" "$what" && { reload=1; CHANGED=1; }
  settings="# Written by longhaul's deploy/bootstrap.sh (run it again to change them, or edit and
# \`systemctl restart $UNIT\`). Variables: deploy/systemd/$UNIT.service.
LONGHAUL_COORDINATOR=$coord
LONGHAUL_LISTEN=$listen
LONGHAUL_DEVICE=$device"
  [[ -n "$metrics" ]] && settings+=$'\n'"LONGHAUL_METRICS_LISTEN=$metrics"
  flags="${named[*]} ${extra[*]}"
  # Quoted: systemd takes the quotes off, and a shell can source the file too.
  settings+=$'\n'"LONGHAUL_WORKER_FLAGS=\"${flags% }\""
  [[ -n "$rt_ld" ]] && settings+=$'\n'"LD_LIBRARY_PATH=$rt_ld"
  # 0600: the join token lives here (read by longhaul-worker from its environment). A dry run does
  # not print it.
  if [[ -n "$join_token" ]]; then
    if ((dry)); then settings+=$'\n'"LONGHAUL_JOIN_TOKEN=(the token, not shown)"; else
      settings+=$'\n'"LONGHAUL_JOIN_TOKEN=$join_token"; fi
  fi
  [[ -n "$ca_fp" ]] && settings+=$'\n'"LONGHAUL_CA_FINGERPRINT=$ca_fp"
  put_file "$ENV_FILE" 0600 "$settings" && CHANGED=1
  if [[ -n "${home_libs:-}" ]]; then
    # ProtectHome=yes would hide a file under /home or /root (a PyTorch in a user's venv).
    note "the worker loads $home_libs, under a home directory: the service gets ProtectHome=read-only"
    put_file "$DROPIN" 0644 "# Written by deploy/bootstrap.sh: the worker loads files from a home directory.
[Service]
ProtectHome=read-only" && { reload=1; CHANGED=1; }
  elif [[ -f "$DROPIN" ]]; then
    as_root rm -f "$DROPIN"; reload=1; CHANGED=1
  fi
  ((reload)) && as_root systemctl daemon-reload
  as_root systemctl enable --quiet "$UNIT"
  if ((CHANGED)) || ! systemctl is-active --quiet "$UNIT" 2>/dev/null; then
    as_root systemctl restart "$UNIT"
    ((dry)) || note "$UNIT: (re)started"
  else
    note "$UNIT: already running with these binaries and settings (not restarted)"
  fi
  if ((dry)); then
    ((verify)) && { step "verify"; note "would wait up to $wait_s s until \`longhaulctl --coordinator=$coord workers\` lists the worker"; }
    say "dry run done"
    exit 0
  fi
  if ((verify)); then
    step "verify: wait for the coordinator to list the worker"
    journal() {
      local inv; inv="$(systemctl show -p InvocationID --value "$UNIT")"
      "${SUDO[@]}" journalctl -u "$UNIT" ${inv:+"_SYSTEMD_INVOCATION_ID=$inv"} -o cat --no-pager
    }
    alive() { [[ "$(systemctl show -p ActiveState --value "$UNIT")" != failed ]]; }
    vr=0; verify_registration journal alive || vr=$?
    ((vr != 1)) || die "$UNIT failed: journalctl -u $UNIT says why"
    ((vr != 2)) || die "$UNIT keeps running and retrying; journalctl -u $UNIT -f follows it"
  fi
  say "done: $UNIT is enabled (starts at boot); logs: journalctl -u $UNIT -f; settings: $ENV_FILE"
  exit 0
fi

# foreground
step "start the worker in the foreground"
data_dir="${data_dir:-/var/lib/longhaul-worker}"
wflags+=("--data-dir=$data_dir")
if ((dry)); then
  note "would run: ${rt_ld:+LD_LIBRARY_PATH=$rt_ld }$(quoted "$prefix/longhaul-worker" "${wflags[@]}")"
  ((verify)) && { step "verify"; note "would wait up to $wait_s s until \`longhaulctl --coordinator=$coord workers\` lists the worker"; }
  say "dry run done"
  exit 0
fi
mkdir -p "$data_dir" || die "cannot create the data directory $data_dir (--data-dir)"
[[ -n "$rt_ld" ]] && export LD_LIBRARY_PATH="$rt_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The token in the worker's environment, not on its command line (ps shows those to every user).
[[ -n "$join_token" ]] && export LONGHAUL_JOIN_TOKEN="$join_token"
[[ -n "$ca_fp" ]] && export LONGHAUL_CA_FINGERPRINT="$ca_fp"
mkdir -p "$LOGDIR"
wlog="$(mktemp "$LOGDIR/worker.XXXXXX")"
trap 'rm -f "$wlog"' EXIT
note "$(quoted "$prefix/longhaul-worker" "${wflags[@]}")"
# The worker's output goes to this terminal and to a copy that step 6 reads; tee ignores Ctrl-C so
# that the worker can still write while it stops (a dead pipe would kill it with SIGPIPE).
"$prefix/longhaul-worker" "${wflags[@]}" > >(trap '' INT TERM; exec tee -a "$wlog") 2>&1 </dev/null &
WORKER=$!
say "worker started (pid $WORKER); SIGTERM or Ctrl-C stops it"
fg_log() { cat "$wlog"; }
fg_alive() { kill -0 "$WORKER" 2>/dev/null; }
if ((verify)); then
  step "verify: wait for the coordinator to list the worker"
  vr=0; verify_registration fg_log fg_alive || vr=$?
  if ((vr == 2)); then
    kill -TERM "$WORKER" 2>/dev/null || true; wait "$WORKER" || true
    exit 1
  fi
  ((vr == 0 || STOPPING)) || say "error: the worker exited before it registered (its output above)" >&2
fi
rc=0
while :; do
  rc=0; wait "$WORKER" || rc=$?
  # wait returns early (status > 128) when a signal handled by on_signal arrives.
  ((rc > 128)) && kill -0 "$WORKER" 2>/dev/null && continue
  break
done
WORKER=""
say "worker exited with status $rc"
exit "$rc"
