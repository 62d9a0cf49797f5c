"""Does recording synchronize the GPU? A kernel that spins for about 200 ms is enqueued, then 100
small ops; if nothing waited for the GPU, the stream is still busy when the host has issued
them all. Prints `no-sync busy=<bool> issue_ms=<host time for the 100 ops> sleep_ms=<kernel>`.
Recorded or not, the program is the same; the test compares."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--sleep-ms", type=float, default=200.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    x = torch.randn(1024, device=dev)
    y = torch.randn(1024, device=dev)
    # Warm-up: lazy initialisation, kernel loading and the recorder's first-use costs are paid
    # here, not inside the measured window.
    for _ in range(20):
        y = y + x
    torch.cuda.synchronize()
    # Cycles per millisecond of torch.cuda._sleep, measured rather than taken from the clock
    # rate, which boost and throttling change.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * args.sleep_ms / start.elapsed_time(end))
    torch.cuda.synchronize()

    stream = torch.cuda.current_stream()
    start.record()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    for _ in range(args.ops):
        y = y + x
    issue_ms = (time.perf_counter() - t0) * 1e3
    busy = not stream.query()
    end.record()
    end.synchronize()
    print(f"no-sync busy={busy} issue_ms={issue_ms:.3f} sleep_ms={start.elapsed_time(end):.3f} "
          f"ops={args.ops}")
    print(f"result {y.sum().item():.9e}")


if __name__ == "__main__":
    main()
