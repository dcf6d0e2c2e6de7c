#!/usr/bin/env bash
# PTX assembled for real: every kernel in shaders/cuda is compiled by NVRTC with the CUDA
# runtime's own options (crates/poot-cuda, `--example ptx`) to PTX for sm_80 and sm_90, then
# assembled by ptxas, which prints registers, shared memory and spills per kernel. Needs no
# GPU. The tools come from PyPI (nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12, about
# 130 MB) into target/cuda-tools on first use; `make ptx-check` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p "$TARGET/cuda-tools"
TOOLS=$(cd "$TARGET/cuda-tools" && pwd)
PY=${PYTHON:-python3}
if [ ! -x "$TOOLS/nvidia/cuda_nvcc/bin/ptxas" ] || [ ! -d "$TOOLS/nvidia/cuda_nvrtc/lib" ]; then
  "$PY" -m pip install -q --no-deps --target "$TOOLS" \
    'nvidia-cuda-nvrtc-cu12==12.9.86' 'nvidia-cuda-nvcc-cu12==12.9.86'
fi
PTXAS="$TOOLS/nvidia/cuda_nvcc/bin/ptxas"
chmod +x "$PTXAS"
export LD_LIBRARY_PATH="$TOOLS/nvidia/cuda_nvrtc/lib:${LD_LIBRARY_PATH:-}"
OUT="$TARGET/ptx"
rm -rf "$OUT"
cargo run -q -p poot-cuda --example ptx -- "$OUT" 80 90 >/dev/null
printf '%-8s %-16s %5s %6s %6s %6s\n' arch kernel regs smem stack spill
for ptx in "$OUT"/*.ptx; do
  arch=${ptx##*.sm_}; arch=${arch%.ptx}
  "$PTXAS" -v -arch="sm_$arch" "$ptx" -o /dev/null 2>&1 | awk -v arch="sm_$arch" '
    /Compiling entry function/ { match($0, /'\''[^'\'']+'\''/); k = substr($0, RSTART + 1, RLENGTH - 2) }
    /bytes stack frame/ { stack = $1; spill = $5 + $9 }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
      printf "%-8s %-16s %5s %6s %6s %6s\n", arch, k, regs, smem, stack, spill
    }'
done
