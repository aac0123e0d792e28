#!/usr/bin/env bash
# Consolidating torch.distributed.checkpoint folders into safetensors, side by side in
# one run (warm cache, no fsync where it can be turned off), on a ~1.2 GB bfloat16
# state dict saved four ways: by one process's dcp.save (the model nested as training
# loops save it: {"model": ...}); by RANKS gloo ranks with every weight sharded on
# dim 0 (FSDP's layout) and on dim 1 (a column split); and by RANKS ranks through
# transformers 5's distributed writer (rank files). For each:
#   cp -r of the folder                        (the bytes moved, nothing converted)
#   devmap save DIR --out OUT                  (chunks' byte ranges copied into place)
#   torch peer: dcp_to_torch_save + torch.load(mmap) + safetensors save_file
#               (torch's own consolidation, then the Hub's convert step); for rank
#               files torch's consolidate_safetensors_files
# Needs the reference venv (DEVMAP_HF_PYTHON, or ~/.cache/devmap/venv-hf/bin/python).
# Usage: [RUNS=5] [RANKS=4] scripts/bench_dcp.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-5}
RANKS=${RANKS:-4}
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

CONSOLIDATE="$WORK/dcp-consolidate.py"
cat > "$CONSOLIDATE" <<'EOF2'
import os, sys
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
names = HuggingFaceStorageReader(src).read_metadata().state_dict_metadata
consolidate_safetensors_files(input_dir=src, output_dir=out, fqn_to_index_mapping=dict.fromkeys(names, 1))
EOF2
for input in "ranks-dim0 0 dcp" "ranks-dim1 1 dcp" "hf-ranks-dim0 0 hf"; do
    read -r name dim writer <<< "$input"
    folder="$WORK/dcp-$name-$RANKS"
    [ -d "$folder" ] || "$PY" scripts/peers/dcp_ranks_save.py "$folder" "$SIZE_MB" "$RANKS" "$dim" "$writer" > /dev/null 2>&1
done

# Before each run: no output left, the input in the page cache.
prepare() { rm -rf "$WORK/dcp-out"; cat "$INPUT"/* "$INPUT"/.metadata > /dev/null 2>&1 || true; }
measure() { median_run "$RUNS" prepare "$@"; rm -rf "$WORK/dcp-out"; }
echo "| input | command | median | peak RSS |"
echo "| --- | --- | ---: | ---: |"
for input in "one process|$MODEL|$PEER" \
             "$RANKS ranks, dim 0|$WORK/dcp-ranks-dim0-$RANKS|$PEER" \
             "$RANKS ranks, dim 1|$WORK/dcp-ranks-dim1-$RANKS|$PEER" \
             "$RANKS ranks, transformers rank files|$WORK/dcp-hf-ranks-dim0-$RANKS|$CONSOLIDATE"; do
    IFS='|' read -r label INPUT peer <<< "$input"
    case $peer in
        "$PEER") peer_name="dcp_to_torch_save + save_file" ;;
        *) peer_name="consolidate_safetensors_files" ;;
    esac
    for row in "cp -r|cp -r $INPUT $WORK/dcp-out" \
               "devmap save --no-fsync|$DEVMAP save $INPUT --config $WORK/dcp-config --out $WORK/dcp-out --no-fsync -q" \
               "$peer_name|$PY $peer $INPUT $WORK/dcp-out"; do
        name=${row%%|*}; cmd=${row#*|}
        read -r s kib < <(measure $cmd)
        echo "| $label ($(du -sh "$INPUT" | cut -f1)) | $name | $s s | $((kib / 1024)) MiB |"
    done
done
