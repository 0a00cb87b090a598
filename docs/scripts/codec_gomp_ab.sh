#!/bin/bash
# GOMP_SPINCOUNT A/B on the codec bench, alternating, three runs each (lead, session 6).
# "default" is libgomp's own default when OMP_WAIT_POLICY is unset (300,000 spins; since 6718609
# distro-node sets 20000 unless the environment says otherwise, so it is given explicitly here).
# Output: $O/gomp_<variant>_<i>.json (bench codec --json --size 1024) and $O/log.
cd "$(dirname "$0")/../.."
O=${O:-/tmp/gomp_ab}; mkdir -p "$O"
for i in 1 2 3; do
  for v in default 20000; do
    echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) gomp $v $i" | tee -a "$O/log"
    spins=$v; [ "$v" = default ] && spins=300000
    GOMP_SPINCOUNT=$spins .venv/bin/distro-node bench codec --json --size 1024 > "$O/gomp_${v}_$i.json" 2>/dev/null
  done
done
