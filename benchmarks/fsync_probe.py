"""What one journal sync costs on this disk: `pwrite` + `fdatasync` of a small record, one after
another (as the commit journal syncs its groups, storage/journal_file.py) and with two loops on
two threads whose syncs are in flight at once.

    .venv/bin/python -m benchmarks.fsync_probe [--dir DIR] [--count 300] [--bytes 600]
        [--rounds 2]

Prints the median and 90th percentile of each sync's wall time and the syncs per second of each
way, alternating the two for `--rounds`. A Remember's latency over HTTP includes one such sync
(its group's), so this is the floor of the write benchmarks' latency on the machine at hand.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time


def probe(path: str, count: int, size: int, threads: int) -> tuple[float, float, float]:
    """(median ms, 90th percentile ms, syncs per second) of `count` syncs per thread."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    lock = threading.Lock()
    end = [0]
    took: list[float] = []
    record = b"r" * size

    def loop() -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            with lock:  # records in order, as the journal appends them
                at = end[0]
                end[0] += size
                os.pwrite(fd, record, at)
            os.fdatasync(fd)
            took.append(time.perf_counter() - t0)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    took.sort()
    return took[len(took) // 2] * 1000, took[int(len(took) * 0.9)] * 1000, len(took) / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="where the probe file goes (default: a temp dir)")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--bytes", type=int, default=600)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "probe")
        for _ in range(args.rounds):
            for threads, label in ((1, "one after another"), (2, "two in flight")):
                p50, p90, rate = probe(path, args.count, args.bytes, threads)
                print(
                    f"{label:>18}: p50 {p50:.2f} ms, p90 {p90:.2f} ms, {rate:.0f} syncs/s "
                    f"(load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
