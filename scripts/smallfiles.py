#!/usr/bin/env python3
"""Generates the small-text-file tree of issue 16: N files of 500-5000 bytes of text, cut at
line starts from the text members of the Silesia corpus (dickens, xml, reymont), 1,000 files
per directory, deterministic (seeded).

usage: smallfiles.py SILESIA_DIR OUT_DIR [N]"""
import os
import random
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
    text = b"".join(open(os.path.join(src, f), "rb").read() for f in ("dickens", "xml", "reymont"))
    rng = random.Random(16)
    total = 0
    for i in range(n):
        d = os.path.join(out, "d%03d" % (i // 1000))
        if i % 1000 == 0:
            os.makedirs(d, exist_ok=True)
        size = rng.randint(500, 5000)
        start = text.find(b"\n", rng.randrange(len(text) - 6000)) + 1
        data = text[start:start + size]
        with open(os.path.join(d, "f%05d.txt" % i), "wb") as f:
            f.write(data)
        total += len(data)
    print(f"{n} files, {total} bytes")


if __name__ == "__main__":
    main()
