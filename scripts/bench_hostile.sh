#!/usr/bin/env bash
# Cost on hostile metadata, measured: a 1,000,000-tensor checkpoint of 1-byte tensors
# (an 88 MB header) saved and inspected, and a 600 KB dotted tensor name placed by a
# device map. Peak RSS from GNU time (%M), wall time from the same run.
# Usage: scripts/bench_hostile.sh [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
need_gnu_time
build_release
mkdir -p "$WORK"

# A million one-byte tensors in one of three tree shapes: layered
# (`model.layers.N.block.wK`), one module with a million children (`t.N.w`), and
# MoE-like (layers × experts × three weights).
million_model() { # DIR SHAPE
    [ -f "$1/model.safetensors" ] && return
    mkdir -p "$1"
    python3 - "$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
n = 1_000_000
shapes = {
    "layered": (f"model.layers.{i // 100}.block.w{i % 100}" for i in range(n)),
    "wide": (f"t.{i}.w" for i in range(n)),
    "moe": (f"l.{layer}.e.{expert}.{w}" for layer in range(61)
            for expert in range(5464) for w in ("g", "u", "d")),
}
header = {"__metadata__": {"format": "pt"}}
for i, name in zip(range(n), shapes[sys.argv[2]]):
    header[name] = {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
count = len(header) - 1
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    f.write(bytes(count))
PY
}
MILLION="$WORK/million"
WIDE="$WORK/million-wide"
MOE="$WORK/million-moe"
million_model "$MILLION" layered
million_model "$WIDE" wide
million_model "$MOE" moe
LONG="$WORK/long-name"
if [ ! -f "$LONG/model.safetensors" ]; then
    mkdir -p "$LONG"
    python3 - "$LONG" <<'PY'
import json, struct, sys
name = ".".join(["a"] * 300_000)
header = {name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
          "b.c.w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(f"{sys.argv[1]}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    f.write(bytes(2))
json.dump({"a.a": "cpu", "b.c": 0, "x.y.z": "disk"}, open(f"{sys.argv[1]}/device_map.json", "w"))
PY
fi

DOTS="$WORK/dots"
if [ ! -f "$DOTS/model.safetensors" ]; then
    mkdir -p "$DOTS"
    python3 - "$DOTS/model.safetensors" <<'PY'
import json, struct, sys
header = {"." * 4_000_000 + "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
          "a.b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + bytes(2))
PY
fi
DEEP="$WORK/deep"
if [ ! -f "$DEEP/model.safetensors" ]; then
    mkdir -p "$DEEP"
    python3 - "$DEEP/model.safetensors" <<'PY'
import json, struct, sys
header = {"l." * k + "w": {"dtype": "U8", "shape": [1], "data_offsets": [k - 1, k]}
          for k in range(1, 4001)}
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + bytes(4000))
PY
fi

measure() { # label, command...
    local label=$1
    shift
    local out
    out=$(timed "$@")
    local secs=${out% *} kib=${out#* }
    printf '| %s | %s s | %s MiB | %s B |\n' "$label" "$secs" "$((kib / 1024))" "$((kib * 1024 / 1000000))"
}
echo "| run | time | peak RSS | per tensor (1M) |"
echo "| --- | ---: | ---: | ---: |"
rm -rf "$WORK/million-out"
measure "save, 1,000,000 tensors, one shard" "$DEVMAP" save "$MILLION" --out "$WORK/million-out" -q
rm -rf "$WORK/million-out"
measure "save, 1,000,000 tensors in one module (t.N.w)" "$DEVMAP" save "$WIDE" --out "$WORK/million-out" -q
rm -rf "$WORK/million-out"
measure "save, 1,000,000 MoE expert tensors" "$DEVMAP" save "$MOE" --out "$WORK/million-out" -q
rm -rf "$WORK/million-out"
measure "inspect (text), 1,000,000 tensors" "$DEVMAP" inspect "$MILLION"
measure "inspect --json, 1,000,000 tensors" "$DEVMAP" inspect "$MILLION" --json
measure "inspect (text), 1,000,000 tensors in one module (t.N.w)" "$DEVMAP" inspect "$WIDE"
measure "inspect --json, 1,000,000 tensors in one module" "$DEVMAP" inspect "$WIDE" --json
measure "inspect (text), 1,000,000 MoE expert tensors" "$DEVMAP" inspect "$MOE"
measure "inspect --json, a 600 KB dotted name" "$DEVMAP" inspect "$LONG" --json
measure "inspect (text), a 600 KB dotted name" "$DEVMAP" inspect "$LONG"
measure "inspect, a 4 MB name of dots" "$DEVMAP" inspect "$DOTS"
measure "inspect, 4,000 modules nested 4,000 deep" "$DEVMAP" inspect "$DEEP"
measure "plan, 4,000 modules nested 4,000 deep" "$DEVMAP" plan "$DEEP" --max-memory cpu=1GB
