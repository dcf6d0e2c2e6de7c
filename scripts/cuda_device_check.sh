#!/usr/bin/env bash
# The CUDA device check, as one script for a machine with an NVIDIA GPU and no Rust toolchain:
# it runs poot-cuda's test binaries built elsewhere (`make cuda-device-bundle` puts them in
# .devcarry/bin) with POOT_REQUIRE_CUDA=1, so a missing device fails instead of skipping:
# the CPU-shim suite, the device conformance suite, the stall/poison test and the matvec
# bandwidth bench. Logs go to $OUT (default ./cuda-check-out).
set -u
BIN=${BIN:-.devcarry/bin}
OUT=${OUT:-./cuda-check-out}
mkdir -p "$OUT"
status=0
{
  date -u
  nvidia-smi || status=1
  nvcc --version 2>&1 | tail -2
  ldd --version 2>&1 | head -1
  command -v cargo || echo "no cargo (expected)"
  command -v c++ || echo "no c++: the shim tests skip here"
} >"$OUT/env.log" 2>&1
# NVRTC: the loader's path first, else the toolkit's or a pip wheel's copy.
if ! ldconfig -p | grep -q 'libnvrtc\.so'; then
  lib=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libnvrtc.so*' 2>/dev/null | grep -v stub | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >>"$OUT/env.log"
export POOT_REQUIRE_CUDA=1
for t in unit nvrtc shim device attention fault; do
  echo "== $t" | tee -a "$OUT/summary.log"
  timeout "${TEST_TIMEOUT:-240}" "$BIN/$t" --test-threads=1 --nocapture >"$OUT/$t.log" 2>&1
  rc=$?
  grep -E '^test |test result|SKIP|panicked|bit-equal|worst|stalled' "$OUT/$t.log" | tee -a "$OUT/summary.log"
  echo "exit $rc" | tee -a "$OUT/summary.log"
  [ $rc -ne 0 ] && status=1
done
echo "== bench" | tee -a "$OUT/summary.log"
timeout "${BENCH_TIMEOUT:-180}" "$BIN/bench" --ignored --nocapture --test-threads=1 >"$OUT/bench.log" 2>&1 || status=1
grep -vE '^(running|test |$)' "$OUT/bench.log" | tee -a "$OUT/summary.log"
exit $status
