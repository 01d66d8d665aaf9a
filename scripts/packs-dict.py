#!/usr/bin/env python3
"""Usage: packs-dict.py TREE WORKDIR

Per pack, zstd -3 with and without a dictionary trained (zstd --train, 112,640 bytes) on the
tree's first 4 MiB of files of at most 64 KiB, as the store trains its own (issue 16). Packs:
the files of at most 128 KiB in readdir order, cut at 128 KiB as the store's plan_packs does.
Writes the samples, the dictionary and all.bin (the packs concatenated, for zstd -b) to
WORKDIR; prints the totals (docs/benchmarks.md, "Packs compressed with the store's
dictionary")."""
import os, sys, subprocess, tempfile
tree, work = sys.argv[1], sys.argv[2]
LIMIT = 128 << 10
files = []
for root, dirs, names in os.walk(tree):
    for n in names:
        p = os.path.join(root, n)
        if os.path.isfile(p) and not os.path.islink(p):
            try:
                d = open(p, 'rb').read()
            except OSError:
                continue
            if 0 < len(d) <= LIMIT:
                files.append(d)
# samples: first files <= 64K up to 4 MiB
os.makedirs(work + '/samples', exist_ok=True)
tot = 0; ns = 0
for d in files:
    if len(d) <= 64 << 10:
        open(f'{work}/samples/{ns}', 'wb').write(d); ns += 1; tot += len(d)
        if tot >= 4 << 20: break
subprocess.run(['zstd', '--train', '-q', '-3', '--maxdict=112640', '-r', work + '/samples', '-o', work + '/dict'], check=True)
packs = []; cur = []; s = 0
for d in files:
    if cur and s + len(d) > LIMIT:
        if len(cur) > 1: packs.append(b''.join(cur))
        cur = []; s = 0
    cur.append(d); s += len(d)
if len(cur) > 1: packs.append(b''.join(cur))
plain = withd = best = 0; wins = 0; small_wins = 0
by = {}
for p in packs:
    a = len(subprocess.run(['zstd', '-3', '-q', '-c', '--no-check'], input=p, capture_output=True, check=True).stdout)
    b = len(subprocess.run(['zstd', '-3', '-q', '-c', '--no-check', '-D', work + '/dict'], input=p, capture_output=True, check=True).stdout)
    plain += a; withd += b; best += min(a, b); wins += b < a
    k = 'lt32K' if len(p) < 32768 else ('lt96K' if len(p) < 98304 else 'full')
    e = by.setdefault(k, [0, 0, 0, 0]); e[0] += 1; e[1] += a; e[2] += b; e[3] += b < a
open(work + '/all.bin', 'wb').write(b''.join(packs))
print(f'{tree}: {len(files)} files <= 128K, {len(packs)} packs, {sum(map(len,packs))} bytes')
print(f'  plain {plain}  dict {withd} ({withd/plain:.3f}x)  best-of-both {best} ({best/plain:.3f}x)  dict wins {wins}/{len(packs)}')
for k, e in sorted(by.items()):
    print(f'  {k}: {e[0]} packs, plain {e[1]} dict {e[2]} ({e[2]/max(e[1],1):.3f}x), dict wins {e[3]}')
