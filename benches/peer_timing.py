"""Timing shared by the peer scripts in this folder (cpu_peers.py, pjrt_pypjrt.py), so that every
peer is measured the same way: the median over timed batches, like criterion's point estimate."""

import statistics
import time


def median_batch_seconds(fn, per_batch, batches):
    """Seconds per call of `fn`: the median over `batches` timed batches of `per_batch` calls."""
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        times.append((time.perf_counter() - t0) / per_batch)
    return statistics.median(times)
