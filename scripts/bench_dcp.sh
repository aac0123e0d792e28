#!/usr/bin/env bash
# Consolidating a torch.distributed.checkpoint folder (one process's dcp.save, the
# model nested as training loops save it: {"model": ...}) into safetensors, side by side
# in one run (warm cache, no fsync where it can be turned off), on a ~1.2 GB bfloat16
# state dict:
#   cp -r of the folder                        (the bytes moved, nothing converted)
#   devmap save DIR --out OUT                  (byte ranges of the .distcp file, copied)
#   torch peer: dcp_to_torch_save + torch.load(mmap) + safetensors save_file
#               (torch's own consolidation, then the Hub's convert step)
# Needs the reference venv (DEVMAP_HF_PYTHON, or ~/.cache/devmap/venv-hf/bin/python).
# Usage: [RUNS=5] scripts/bench_dcp.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-5}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
"$PY" -c "import torch, safetensors" || { echo "needs torch and safetensors in $PY"; exit 1; }

build_release
MODEL="$WORK/dcp-model"
mkdir -p "$WORK"
if [ ! -f "$MODEL/.metadata" ]; then
    "$PY" - "$MODEL" "$SIZE_MB" <<'EOF2'
import sys
import torch.distributed.checkpoint as dcp
sys.path.insert(0, "scripts/peers")
from bench_state import layers_state
out, size_mb = sys.argv[1], int(sys.argv[2])
state = layers_state(size_mb)
dcp.save({"model": state, "epoch": 1}, checkpoint_id=out)
EOF2
    mkdir -p "$WORK/dcp-config"
    echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}' > "$WORK/dcp-config/config.json"
fi
PEER="$WORK/dcp-peer.py"
cat > "$PEER" <<'EOF2'
import os, sys, torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
pt = os.path.join(out, "consolidated.pt")
dcp_to_torch_save(src, pt)
state = torch.load(pt, mmap=True, weights_only=True)["model"]
save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
os.remove(pt)
EOF2

# Before each run: no output left, the input in the page cache.
prepare() { rm -rf "$WORK/dcp-out"; cat "$MODEL"/* "$MODEL"/.metadata > /dev/null; }
measure() { median_run "$RUNS" prepare "$@"; rm -rf "$WORK/dcp-out"; }
echo "input: $(du -sh "$MODEL" | cut -f1) in one .distcp file"
echo "| command | median | peak RSS |"
echo "| --- | ---: | ---: |"
for row in "cp -r|cp -r $MODEL $WORK/dcp-out" \
           "devmap save --no-fsync|$DEVMAP save $MODEL --config $WORK/dcp-config --out $WORK/dcp-out --no-fsync -q" \
           "dcp_to_torch_save + save_file|$PY $PEER $MODEL $WORK/dcp-out"; do
    name=${row%%|*}; cmd=${row#*|}
    read -r s kib < <(measure $cmd)
    echo "| $name | $s s | $((kib / 1024)) MiB |"
done
