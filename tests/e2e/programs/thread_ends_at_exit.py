"""A thread that records ops and ends just as the process leaves through os._exit, as a DataLoader
worker leaves without joining its queue's feeder thread: the thread's stream is ended (its MD5
batch run, its END written) while the process exits.

    python thread_ends_at_exit.py [--delay-us D] [--tensors N]

The thread's last N outputs (256 KiB each) wait in its MD5 batch, so its end takes a while; the
main thread joins it, waits D microseconds and calls os._exit(0).
"""
import argparse
import os
import threading
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-us", type=int, default=0)
    ap.add_argument("--tensors", type=int, default=100)
    args = ap.parse_args()
    source = torch.arange(65536, dtype=torch.float32)

    def work():
        kept = [source + i for i in range(args.tensors)]
        print(f"thread made {len(kept)} tensors", flush=True)

    worker = threading.Thread(target=work, name="ender")
    worker.start()
    worker.join()
    time.sleep(args.delay_us / 1e6)
    os._exit(0)


if __name__ == "__main__":
    main()
