"""Check, not timing: the multi-process tests run many times in a row, each under a timeout, counting hangs.

About 1 run in 10 of the 2-process tests once hung at exit (the process group was destroyed before the DDP module
that held it; see docs/RELIABILITY.md, "The end of a multi-process run"). One run proves nothing about a 1-in-10
hang, so this loop is kept out of the suite: run it after touching how processes start or end.

    python -m benchmarks.two_process_exit_loop                  # 20 rounds of the three 2-process tests
    python -m benchmarks.two_process_exit_loop --rounds 70 --timeout 300

Each round is one pytest run of the tests below; a run past --timeout is counted as a hang and killed.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TWO_PROCESS_TESTS = (
    "tests/training/test_training.py::test_two_processes_match_one_process",
    "tests/training/test_probe_training.py::test_two_processes_train_the_same_linear_probes",
    "tests/training/test_probe_feature_cache.py::test_two_processes_recompute_their_own_share_as_they_would_cache_it",
)


def run_round(timeout_s: float) -> tuple[str, float]:
    """("passed" | "failed" | "hang", seconds) of one pytest run of TWO_PROCESS_TESTS."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TWO_PROCESS_TESTS]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    # a session of its own, so that a hung round's torchrun children are killed with it
    process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        outcome = "passed" if process.wait(timeout=timeout_s) == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        outcome = "hang"
    return outcome, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="pytest runs of the 2-process tests")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds after which a round counts as a hang")
    args = parser.parse_args(argv)
    counts = {"passed": 0, "failed": 0, "hang": 0}
    for round_index in range(1, args.rounds + 1):
        outcome, seconds = run_round(args.timeout)
        counts[outcome] += 1
        print(f"round {round_index}/{args.rounds}: {outcome} in {seconds:.0f} s", flush=True)
    print(f"{args.rounds} rounds of {len(TWO_PROCESS_TESTS)} tests: {counts['passed']} passed, "
          f"{counts['failed']} failed, {counts['hang']} hung (over {args.timeout:.0f} s)")  # fmt: skip
    return counts


if __name__ == "__main__":
    outcomes = main()
    sys.exit(1 if outcomes["failed"] or outcomes["hang"] else 0)
