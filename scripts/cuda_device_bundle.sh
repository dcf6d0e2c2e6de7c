#!/usr/bin/env bash
# Builds poot-cuda's test binaries here and gathers what a GPU machine with no Rust toolchain
# needs to run the device check: .devcarry/bin/{unit,shim,device,attention,fault,nvrtc,bench}
# and .devcarry/cuda_device_check.sh. Ship .devcarry to the GPU machine (it is ignored by git:
# add `/.devcarry/` to .git/info/exclude) and run `bash .devcarry/cuda_device_check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.devcarry}
rm -rf "$DEST" && mkdir -p "$DEST/bin"
cargo test -p poot-cuda --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind, name = m["target"]["kind"], m["target"]["name"]
        if kind == ["test"] or (kind == ["lib"] and name == "poot_cuda"):
            out = name if kind == ["test"] else "unit"
            shutil.copy(m["executable"], dest + "/bin/" + out)
' "$DEST"
strip "$DEST"/bin/* 2>/dev/null || true
cp scripts/cuda_device_check.sh "$DEST/"
ls -la "$DEST/bin"
