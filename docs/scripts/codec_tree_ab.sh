#!/bin/bash
# codec bench: session 5's tree (92f2eaf, /tmp/old92 first on PYTHONPATH) vs this tree, alternating
O=${O:-/tmp/codec_tree_ab}; mkdir -p $O
# prepare the old tree first:
#   mkdir -p /tmp/old92/distronet && git archive 92f2eaf coordinator dashboard kernels node protocol | tar -x -C /tmp/old92/distronet
cd /tmp
for i in 1 2; do
  for v in old new new300k; do
    echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $v $i" | tee -a $O/log
    case $v in
      old) PYTHONPATH=/tmp/old92 /work/main/.venv/bin/python -m distronet.node.cli bench codec --json --size 1024 > $O/on_${v}_$i.json 2>/dev/null ;;
      new) /work/main/.venv/bin/python -m distronet.node.cli bench codec --json --size 1024 > $O/on_${v}_$i.json 2>/dev/null ;;
      new300k) GOMP_SPINCOUNT=300000 /work/main/.venv/bin/python -m distronet.node.cli bench codec --json --size 1024 > $O/on_${v}_$i.json 2>/dev/null ;;
    esac
  done
done
