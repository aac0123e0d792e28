#!/usr/bin/env bash
# Converting a pytorch_model.bin checkpoint to safetensors, side by side in one run
# (warm cache, no fsync where it can be turned off), on a ~1.2 GB bfloat16 state dict
# torch wrote in 3 shards with transformers' index:
#   cp -r of the folder                       (the bytes moved, nothing converted)
#   devmap save DIR --out OUT                 (byte ranges of the archive, copied)
#   torch peer: torch.load(mmap=True) + safetensors.torch.save_file per shard
#              (what the Hub's convert script does, one shard at a time)
# Needs the reference venv (DEVMAP_HF_PYTHON, or ~/.cache/devmap/venv-hf/bin/python).
# Usage: [RUNS=5] scripts/bench_bin.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-5}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
"$PY" -c "import torch, safetensors" || { echo "needs torch and safetensors in $PY"; exit 1; }

build_release
MODEL="$WORK/bin-model"
mkdir -p "$WORK"
if [ ! -f "$MODEL/pytorch_model.bin.index.json" ]; then
    "$PY" - "$MODEL" "$SIZE_MB" <<'EOF'
import json, os, sys, torch
sys.path.insert(0, "scripts/peers")
from bench_state import layers_state
out, size_mb = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
state = layers_state(size_mb)
names = list(state)
per = -(-len(names) // 3)
weight_map = {}
for i in range(3):
    part = names[i * per:(i + 1) * per]
    file = f"pytorch_model-{i + 1:05d}-of-00003.bin"
    torch.save({n: state[n] for n in part}, os.path.join(out, file))
    weight_map.update({n: file for n in part})
json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "pytorch_model.bin.index.json"), "w"))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, open(os.path.join(out, "config.json"), "w"))
EOF
fi
PEER="$WORK/bin-peer.py"
cat > "$PEER" <<'EOF'
import json, os, sys, torch
from safetensors.torch import save_file
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
index = json.load(open(os.path.join(src, "pytorch_model.bin.index.json")))
for file in sorted(set(index["weight_map"].values())):
    state = torch.load(os.path.join(src, file), mmap=True, weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, file.replace("pytorch_model", "model").replace(".bin", ".safetensors")), metadata={"format": "pt"})
EOF

# Before each run: no output left, the input in the page cache.
prepare() { rm -rf "$WORK/bin-out"; cat "$MODEL"/* > /dev/null; }
measure() { median_run "$RUNS" prepare "$@"; rm -rf "$WORK/bin-out"; }
echo "input: $(du -sh "$MODEL" | cut -f1) in 3 .bin shards"
echo "| command | median | peak RSS |"
echo "| --- | ---: | ---: |"
for row in "cp -r|cp -r $MODEL $WORK/bin-out" \
           "devmap save --no-fsync|$DEVMAP save $MODEL --out $WORK/bin-out --no-fsync -q" \
           "torch.load(mmap) + save_file|$PY $PEER $MODEL $WORK/bin-out"; do
    name=${row%%|*}; cmd=${row#*|}
    read -r s kib < <(measure $cmd)
    echo "| $name | $s s | $((kib / 1024)) MiB |"
done
