#!/usr/bin/env bash
# verl FSDP checkpoints (each FSDP2 rank's `model_world_size_N_rank_K.pt` of DTensors)
# converted side by side in one run: `devmap save ACTOR` against what verl's model
# merger does (scripts/peers/verl_peer.py merge: torch.load every rank file, torch.cat
# the local tensors, safetensors' save_file), and `cp` of devmap's output as the
# yardstick; warm page cache, `--no-fsync` (the peer does not fsync either), peak RSS
# from GNU time. The checkpoint: a ~0.55 GB float32 Llama saved by WORLD gloo ranks on
# CPU (scripts/peers/verl_peer.py make), made once under WORKDIR.
# Usage: [RUNS=3] [WORLD=4] scripts/bench_verl.sh [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
RUNS=${RUNS:-3}
WORLD=${WORLD:-4}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
build_release
ACTOR="$WORK/verl-actor-$WORLD"
[ -d "$ACTOR" ] || "$PY" scripts/peers/verl_peer.py make "$ACTOR" "$WORLD"
OUT="$WORK/verl-devmap" PEER="$WORK/verl-peer" CP="$WORK/verl-cp"
export DEVMAP ACTOR OUT PEER CP PY
warm() { rm -rf "$OUT" "$PEER" "$CP"; cat "$ACTOR"/*.pt > /dev/null; }
run_devmap() { "$DEVMAP" save "$ACTOR" --out "$OUT" --no-fsync -q; }
run_peer() { "$PY" scripts/peers/verl_peer.py merge "$ACTOR" "$PEER"; }
export -f run_devmap run_peer
read -r d drss p r _ _ < <(side_by_side "$RUNS" warm run_devmap warm run_peer)
read -r _ prss < <(warm; timed_ms bash -c run_peer)
warm; run_devmap
cp_once() { rm -rf "$CP"; mkdir -p "$CP"; }
run_cp() { cp "$OUT"/*.safetensors "$CP/"; }
read -r d2 _ c rc lo hi < <(side_by_side "$RUNS" warm run_devmap cp_once run_cp)
BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
echo "| run ($WORLD rank files, $((BYTES / 1048576)) MiB out) | seconds (median of $RUNS, alternating) | vs cp | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of devmap's output | $c | 1.00 | — |"
echo "| devmap save --no-fsync | $d2 | $rc ($lo–$hi) | $((drss / 1024)) |"
echo "| verl's merger (torch.load, torch.cat, save_file) | $p | $(ratio "$p" "$c") | $((prss / 1024)) |"
echo "(devmap against the merger, side by side: $d s vs $p s, devmap / merger = $r)"
rm -rf "$OUT" "$PEER" "$CP"
