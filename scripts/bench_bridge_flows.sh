#!/usr/bin/env bash
# Issue 37's flows from a Python session, measured on its ~0.9 GB float32 Llama
# (hidden 1024, 12 layers):
# - the seed's flow: layers 0–2 on the CPU, 3–11 on disk, a LoRA on q_proj/v_proj of
#   every layer merged by peft, then saved by devmap.save_pretrained (with and without
#   fsync) and by transformers' save_pretrained, each in a fresh process after `sync`,
#   alternating (scripts/peers/peft_offload_peer.py; growth of peak RSS and of
#   anonymous memory from before the save);
# - devmap.save_on_signal: the time from SIGTERM to the commit, the model trained on
#   the CPU (scripts/peers/signal_save_peer.py).
# Needs the reference venv with the package installed (`pip install ./python`).
# Usage: [RUNS=3] scripts/bench_bridge_flows.sh [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
"$PY" -c "import devmap, torch, transformers, peft" || { echo "needs torch, transformers, peft and the devmap package (pip install ./python) in $PY"; exit 1; }
MODEL="$WORK/bridge-model"
mkdir -p "$WORK"
if [ ! -f "$MODEL/config.json" ]; then
    "$PY" - "$MODEL" <<'PYEOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                     num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
PYEOF
fi
echo "model: $(du -sh "$MODEL" | cut -f1) in $MODEL"
results=$(mktemp)
for run in $(seq "$RUNS"); do
    for who in devmap devmap-no-fsync transformers; do
        rm -rf "$WORK"/bridge-out-* "$WORK"/bridge-offload-*
        sync
        "$PY" scripts/peers/peft_offload_peer.py "$MODEL" "$WORK/bridge-offload-$who" "$WORK/bridge-out-$who" "$who" \
            2>>"$WORK/bridge-peers.log" | tail -1 >> "$results"
    done
    rm -rf "$WORK"/bridge-signal
    sync
    "$PY" scripts/peers/signal_save_peer.py "$MODEL" "$WORK/bridge-signal" 2>>"$WORK/bridge-peers.log" \
        | tail -1 | sed 's/^{/{"who": "signal", /' >> "$results"
done
rm -rf "$WORK"/bridge-out-* "$WORK"/bridge-offload-* "$WORK"/bridge-signal
"$PY" - "$results" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| peft-merged offloaded model, saved by | median s | peak RSS growth | of it anonymous |")
print("| --- | --- | --- | --- |")
for who in ("devmap", "devmap-no-fsync", "transformers"):
    mine = [r for r in rows if r["who"] == who]
    s = statistics.median(r["seconds"] for r in mine)
    g = statistics.median(r["growth"] for r in mine) / 2**20
    a = statistics.median(r["anon_growth"] for r in mine) / 2**20
    print(f"| {who} | {s:.2f} | {g:.0f} MiB | {a:.0f} MiB |")
sig = [r for r in rows if r["who"] == "signal"]
s = statistics.median(r["seconds"] for r in sig)
gb = sig[0]["bytes"] / 1e9
print(f"\nsave_on_signal: SIGTERM to commit {s:.2f} s for {gb:.2f} GB ({gb / s:.2f} GB/s; "
      f"at that rate 30 s holds about {30 * gb / s:.0f} GB)")
PYEOF
rm -f "$results"
