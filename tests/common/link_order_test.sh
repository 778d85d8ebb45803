#!/usr/bin/env bash
# Each binary given that needs LibTorch names libstdc++ before any LibTorch library among its needed
# libraries (readelf -d), so that its C++ standard library symbols resolve to libstdc++'s: the
# PyTorch wheel's libtorch.so exports its own std::filesystem, which crashed our binaries
# (CMakeLists.txt, add_link_options). Usage: link_order_test.sh BINARY...
set -euo pipefail
command -v readelf >/dev/null || { echo "SKIPPED: no readelf (binutils)"; exit 0; }
status=0
for bin in "$@"; do
  mapfile -t needed < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  std=-1 torch=-1
  for i in "${!needed[@]}"; do
    case "${needed[$i]}" in
      libstdc++.so*) ((std < 0)) && std=$i ;;
      libtorch*.so* | libc10*.so*) ((torch < 0)) && torch=$i ;;
    esac
  done
  if ((torch < 0)); then
    echo "$bin: needs no LibTorch library"
  elif ((std < 0 || std > torch)); then
    echo "FAIL $bin: ${needed[$torch]} is needed before libstdc++ (needed: ${needed[*]})"
    status=1
  else
    echo "$bin: libstdc++ (#$std) before ${needed[$torch]} (#$torch)"
  fi
done
exit $status
