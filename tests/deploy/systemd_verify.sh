#!/usr/bin/env bash
# `systemd-analyze verify` on deploy/systemd/*.service, failing on any message (verify itself exits
# 0 after "Unknown key" or "Failed to parse" warnings, which would hide a misspelt hardening option).
# verify also checks that every Exec*= binary exists and is executable: the units name the install
# path, /usr/local/bin, so they are checked as copies naming this build's binaries instead (only
# that path differs).
# usage: systemd_verify.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src="$1" bin="$2"
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIPPED: systemd-analyze is not installed (Debian/Ubuntu package systemd)"
  exit 0
fi
units=("$src"/deploy/systemd/*.service)
[[ -e "${units[0]}" ]] || { echo "no units in $src/deploy/systemd"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for u in "${units[@]}"; do
  grep -q '/usr/local/bin/' "$u" || { echo "$(basename "$u"): ExecStart does not name /usr/local/bin/"; exit 1; }
  for exe in $(grep -o '/usr/local/bin/[A-Za-z0-9_.-]*' "$u" | sort -u); do
    [[ -x "$bin/$(basename "$exe")" ]] || { echo "$(basename "$u") runs $exe, which this build does not make"; exit 1; }
  done
  sed "s#/usr/local/bin/#$bin/#g" "$u" >"$tmp/$(basename "$u")"
done
status=0
out="$(cd "$tmp" && systemd-analyze verify --man=no ./*.service 2>&1)" || status=$?
if [[ $status -ne 0 || -n "$out" ]]; then
  echo "systemd-analyze verify failed (exit $status):"
  echo "$out"
  exit 1
fi
echo "systemd-analyze verify: ${#units[@]} units ok ($(systemd-analyze --version | head -1))"
