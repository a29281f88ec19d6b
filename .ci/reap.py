#!/usr/bin/env python3
"""Stop what one CI run left running, and nothing else: ``reap.py MARK [--except PID ...]``.

``.ci/run`` exports ``BROKER_CI_RUN=<MARK>`` (unique per run) before the tests; every process the
run starts inherits it, test servers in their own sessions too (tests/processes.py copies the
environment). This finds the processes whose environment holds exactly that mark, sends each
SIGTERM, and SIGKILLs those still there after ``--grace`` seconds (django-q2's qcluster can hang on
SIGTERM). Processes are matched by pid and their environment, never by name, so other brokers,
qclusters and test runs on the machine are left alone.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

VARIABLE = b"BROKER_CI_RUN"


def marked_pids(mark: str, exclude: set[int]) -> list[int]:
    """Pids whose environment has BROKER_CI_RUN=<mark> (unreadable or vanished ones are skipped)."""
    wanted = VARIABLE + b"=" + mark.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                entries = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted in entries:
            found.append(int(name))
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mark", help="the run's BROKER_CI_RUN value")
    parser.add_argument("--except", dest="keep", type=int, action="append", default=[],
                        help="a pid to leave alone (the calling script)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    if len(args.mark) < 8:
        parser.error("the mark must be a unique per-run value (8 characters or more)")
    exclude = {os.getpid(), os.getppid(), *args.keep}
    pids = marked_pids(args.mark, exclude)
    if not pids:
        return 0
    print(f"reap: stopping {len(pids)} process(es) left by this run: {' '.join(map(str, sorted(pids)))}",
          file=sys.stderr)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while time.monotonic() < deadline:
        # re-read: a pid that exited (or was reused by an unmarked process) is not signalled again
        pids = marked_pids(args.mark, exclude)
        if not pids:
            return 0
        time.sleep(0.2)
    signal_all(marked_pids(args.mark, exclude), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
