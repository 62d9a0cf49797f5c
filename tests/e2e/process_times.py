"""Sums a DETAUDIT_E2E_TIMES log (detaudit_testlib.log_process_time): the seconds each test, each
module and each kind of command spent in the processes it started, most first.

    DETAUDIT_E2E_TIMES=/tmp/times.jsonl ctest -R e2e ...; python3 process_times.py /tmp/times.jsonl
"""
import collections
import json
import sys


def main(path, top=25):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_test, by_module, by_command = (collections.Counter() for _ in range(3))
    for r in rows:
        torch = f' ({r["python"]})' if "python" in r else ""
        by_test[r["test"] + torch] += r["seconds"]
        by_module[r["test"].split(".")[0] + torch] += r["seconds"]
        words = [a for a in r["argv"] if not a.startswith("-")]
        by_command[" ".join(words[:1] + [w for w in words[1:] if w.endswith(".py")][:1])] += \
            r["seconds"]
    print(f"{len(rows)} processes, {sum(r['seconds'] for r in rows):.0f} s")
    for title, counter in (("module", by_module), ("test", by_test), ("command", by_command)):
        print(f"\nby {title}:")
        for name, seconds in counter.most_common(top):
            print(f"{seconds:8.1f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
