#!/usr/bin/env bash
# Run 86, third call: PyTorch training (GPT-2 small, ResNet-50) with the
# default allocator (native:pool) on the new library (lib/, 3c61a2f)
# and the one before (lib-base/, 37ba6d9), beside PyTorch's own, in turn:
# torch, new, base, then base, new.
set -u
B=$(cd "$(dirname "$0")" && pwd)
cd "$B"
O=${OUT:-/tmp/out}; mkdir -p "$O"
speed() { # $1 = lib dir, $2 = config, $3 = tag
  GPUMEM_LIB=$B/$1/libgpumem.so PYTHONPATH=$B/python timeout 200 python3 python/bench/torch_allocators.py speed \
    --configs $2 --out "$O/torch_$3.jsonl" >> "$O/torch.log" 2>&1
}
speed lib torch torch
speed lib native:pool new
speed lib-base native:pool base
speed lib-base native:pool base
speed lib native:pool new
python3 - "$O" <<'PY'
import json, sys
o = sys.argv[1]
for tag in ("torch", "new", "base"):
    try:
        for l in open(f"{o}/torch_{tag}.jsonl"):
            r = json.loads(l)
            print(f"{tag:5} {r['config']:12} {r['model']:9} s/iter {r.get('s_per_iter')} peak_reserved {r.get('peak_reserved')} max_allocated {r.get('max_allocated')} rc {r.get('rc')} {r.get('error','')[-200:] if r.get('error') else ''}")
    except OSError as e:
        print(tag, "no results", e)
PY
tail -n 3 "$O/torch.log"
