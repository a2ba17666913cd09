#!/usr/bin/env python3
"""Deterministic dataset generator for sluice's benchmarks.

    gen.py dense DIR   200,000 files of 1 KiB in a 3-level tree (20 x 10 x 1000)
    gen.py mixed DIR   ~30,000 files, log-normal sizes 1 KiB..256 MiB, ~3 GiB
    gen.py huge  DIR   one 8 GiB file
    gen.py onedir DIR  one directory of 1,000,000 empty files

Same arguments give the same tree, byte for byte (seeded PRNG). Options:
--files N and --size BYTES shrink a shape for quick runs.
"""
import argparse
import os
import random

BLOCK = random.Random(42).randbytes(1 << 20)  # 1 MiB of incompressible data


def write_file(path, size, salt):
    with open(path, "wb") as f:
        off = salt % len(BLOCK)
        left = size
        while left > 0:
            piece = BLOCK[off:off + left] if off + left <= len(BLOCK) else BLOCK[off:]
            f.write(piece)
            left -= len(piece)
            off = 0


def dense(root, files, per_leaf=1000):
    leaves = max(1, files // per_leaf)
    n = 0
    for i in range(leaves):
        d = os.path.join(root, f"d{i // 10 % 20:02d}", f"e{i % 10}", f"f{i // 200:03d}")
        os.makedirs(d, exist_ok=True)
        for j in range(per_leaf):
            if n >= files:
                return
            write_file(os.path.join(d, f"file{j:04d}.dat"), 1024, n * 7919)
            n += 1


def mixed(root, files):
    rng = random.Random(7)
    total = 0
    for n in range(files):
        size = int(min(256 << 20, max(1024, rng.lognormvariate(9.0, 2.35))))
        d = os.path.join(root, f"m{n % 37:02d}", f"n{n % 11:02d}")
        os.makedirs(d, exist_ok=True)
        write_file(os.path.join(d, f"obj{n:06d}.bin"), size, n * 104729)
        total += size
    print(f"mixed: {files} files, {total / (1 << 30):.2f} GiB")


def huge(root, size):
    os.makedirs(root, exist_ok=True)
    write_file(os.path.join(root, "huge.img"), size, 0)


def onedir(root, files):
    d = os.path.join(root, "flat")
    os.makedirs(d, exist_ok=True)
    for n in range(files):
        with open(os.path.join(d, f"entry{n:07d}"), "wb"):
            pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=["dense", "mixed", "huge", "onedir"])
    p.add_argument("dir")
    p.add_argument("--files", type=int)
    p.add_argument("--size", type=int)
    p.add_argument("--per-dir", type=int, default=1000, help="dense: files per directory")
    a = p.parse_args()
    if a.shape == "dense":
        dense(a.dir, a.files or 200_000, a.per_dir)
    elif a.shape == "mixed":
        mixed(a.dir, a.files or 30_000)
    elif a.shape == "huge":
        huge(a.dir, a.size or (8 << 30))
    else:
        onedir(a.dir, a.files or 1_000_000)


if __name__ == "__main__":
    main()
