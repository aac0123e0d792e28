#!/usr/bin/env bash
# Saving a live model from a Python session, side by side in one run: a ~1.1 GB
# bfloat16 Llama loaded with half its layers on disk (transformers' offload index into
# the checkpoint) and half on the CPU, one parameter edited in place, then saved by
#   devmap.save_pretrained(model, out)          (the devmap package)
#   model.save_pretrained(out)                  (transformers)
# each in a fresh process, alternating, warm cache, after a `sync` (no other output's
# dirty pages to write back); devmap with its default fsync and without (transformers
# does not fsync). Peak RSS growth is measured from the process's RSS after loading
# (VmHWM reset through /proc/self/clear_refs); its anonymous part (what the save
# allocates, apart from mapped file pages it reads) is sampled every 5 ms.
# Needs the reference venv with the package installed (`pip install ./python`).
# Usage: [RUNS=3] scripts/bench_live_save.sh [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and median peak RSS growth.
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
"$PY" -c "import devmap, torch, transformers" || { echo "needs torch, transformers and the devmap package (pip install ./python) in $PY"; exit 1; }
MODEL="$WORK/live-model"
mkdir -p "$WORK"
if [ ! -f "$MODEL/config.json" ]; then
    "$PY" - "$MODEL" <<'PYEOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                     num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
with torch.device("cpu"):
    model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
PYEOF
fi
echo "model: $(du -sh "$MODEL" | cut -f1) in $MODEL"
results=$(mktemp)
for run in $(seq "$RUNS"); do
    for who in devmap devmap-no-fsync transformers; do
        # Each save starts with no dirty pages of another's output to write back.
        rm -rf "$WORK"/live-out-* "$WORK"/live-offload-*
        sync
        flag=""; [ "$who" = devmap-no-fsync ] && flag=--no-fsync
        "$PY" scripts/peers/live_save_peer.py "$MODEL" "$WORK/live-offload-$who" "$WORK/live-out-$who" \
            "${who%-no-fsync}" $flag 2>/dev/null | tail -1 | sed "s/\"who\": \"devmap\"/\"who\": \"$who\"/" >> "$results"
    done
done
"$PY" - "$results" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| saver | median s | peak RSS growth | of it anonymous |")
print("| --- | --- | --- | --- |")
for who in ("devmap", "devmap-no-fsync", "transformers"):
    mine = [r for r in rows if r["who"] == who]
    s = statistics.median(r["seconds"] for r in mine)
    g = statistics.median(r["growth"] for r in mine) / 2**20
    a = statistics.median(r["anon_growth"] for r in mine) / 2**20
    print(f"| {who} | {s:.2f} | {g:.0f} MiB | {a:.0f} MiB |")
PYEOF
rm -f "$results"
