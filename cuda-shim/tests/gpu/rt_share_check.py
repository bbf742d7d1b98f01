"""Compares two rt_share.py logs: every step both reached has the same loss (the same
training, one of them moved mid-run). Exit 0 when they agree on at least 5 steps."""

import sys

a, b = (
    {int(l.split()[1]): l.split()[2] for l in open(p) if l.startswith("LOSS ")}
    for p in sys.argv[1:3]
)
common = sorted(set(a) & set(b))
diff = [s for s in common if a[s] != b[s]]
print(f"== losses: {len(common)} common steps (to step {common[-1] if common else 0}), {len(diff)} differ")
sys.exit(1 if diff or len(common) < 5 else 0)
