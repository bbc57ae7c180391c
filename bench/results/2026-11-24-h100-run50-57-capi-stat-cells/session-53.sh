#!/usr/bin/env bash
# Run 53 (issue 19): ResNet-50 under PyTorch on native:pool, the library before (base) and after the statistics counted per lock shard, alternating.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
export PYTHONPATH=$B/python GPUMEM_DEVICE=cuda
O=${OUT:-/tmp/out}; mkdir -p "$O"
S=$O/summary.txt
for round in 1 2 3; do
  for lib in libgpumem-base.so libgpumem.so; do
    for model in resnet50 gpt2; do
      r=$(GPUMEM_LIB=$B/lib/$lib timeout 200 python3 python/bench/torch_allocators.py child speed native:pool $model 6.0 2>>"$O/err.log" | grep '^RESULT ' | tail -1)
      echo "{\"round\": $round, \"lib\": \"$lib\", \"model\": \"$model\", \"result\": ${r#RESULT }, \"date\": \"$(date -u +%F)\", \"device\": \"H100\", \"command\": \"torch_allocators.py child speed native:pool $model 6.0\"}" >> "$O/torch-ab.jsonl"
    done
  done
done
python3 - "$O" >> "$S" <<'PY'
import json, sys
for l in open(sys.argv[1] + "/torch-ab.jsonl"):
    try:
        r = json.loads(l)
        print(r["round"], r["lib"], r["model"], round(r["result"]["s_per_iter"], 5), r["result"]["peak_reserved"])
    except Exception as e:
        print("bad line", l[:200], e)
PY
tail -3 "$O/err.log" >> "$S"
cat "$S"
