#!/usr/bin/env bash
# A model sharded over the ranks of a job, saved side by side in one run: a ~0.9 GB
# float32 Llama, sharded by FSDP2 over WORLD CPU ranks (gloo), saved
#   by devmap.save_pretrained on every rank (each writes its own blocks, rank 0 commits)
#   by torch's get_model_state_dict(full_state_dict=True, cpu_offload=True) and
#      save_pretrained(state_dict=full) on rank 0 (the gather every FSDP recipe uses)
# each in fresh processes (scripts/peers/fsdp_save_peer.py), alternating, after a
# `sync`; and `cp` of devmap's output file as the yardstick. devmap fsyncs every shard
# (its default); transformers does not. Per-rank peak RSS growth is measured from each
# rank's RSS before the save.
# Needs the reference venv with the package installed (`pip install ./python`).
# Usage: [RUNS=3] [WORLDS="2 4"] scripts/bench_fsdp_ranks.sh [WORKDIR=target/bench]
# Prints a Markdown table of medians.
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
RUNS=${RUNS:-3}
WORLDS=${WORLDS:-2 4}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
"$PY" -c "import devmap, torch, transformers" || { echo "needs torch, transformers and the devmap package (pip install ./python) in $PY"; exit 1; }
mkdir -p "$WORK"
results=$(mktemp)
for world in $WORLDS; do
    for run in $(seq "$RUNS"); do
        for who in devmap gather; do
            rm -rf "$WORK"/fsdp-out-* "$WORK"/fsdp-cp
            sync
            "$PY" scripts/peers/fsdp_save_peer.py "$who" "$world" "$WORK/fsdp-out-$who" 2>>"$WORK/fsdp-peers.log" | tail -1 >> "$results"
            if [ "$who" = devmap ]; then
                sync
                start=$(date +%s.%N)
                cp -r "$WORK/fsdp-out-devmap" "$WORK/fsdp-cp"
                sync
                echo "{\"who\": \"cp\", \"world\": $world, \"seconds\": $(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $start }"), \"ranks\": []}" >> "$results"
            fi
        done
    done
done
rm -rf "$WORK"/fsdp-out-* "$WORK"/fsdp-cp
"$PY" - "$results" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| ranks | saver | median s | shards per rank | rank 0 peak growth | largest other rank's growth |")
print("| --- | --- | --- | --- | --- | --- |")
for world in sorted({r["world"] for r in rows}):
    for who in ("devmap", "gather", "cp"):
        mine = [r for r in rows if r["who"] == who and r["world"] == world]
        if not mine:
            continue
        s = statistics.median(r["seconds"] for r in mine)
        if who == "cp":
            print(f"| {world} | cp -r of devmap's output (+ sync) | {s:.2f} | | | |")
            continue
        shard = mine[0]["ranks"][0]["shard_bytes"] / 2**20
        g0 = statistics.median(r["ranks"][0]["growth"] for r in mine) / 2**20
        go = statistics.median(max(x["growth"] for x in r["ranks"][1:]) for r in mine) / 2**20
        name = "devmap.save_pretrained on every rank" if who == "devmap" else "full_state_dict gather + save_pretrained on rank 0"
        print(f"| {world} | {name} | {s:.2f} | {shard:.0f} MiB | {g0:.0f} MiB | {go:.0f} MiB |")
PYEOF
rm -f "$results"
