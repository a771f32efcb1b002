"""
A benchmark workload built and timed in a process of its own.

On the CPU a training step's time moves with the heap's state: glibc maps and unmaps large tensors, and what one
model frees shapes the page faults of the next one's step (docs/speed.md). The speed benchmark therefore times each
model's training in a process of its own, as the training command runs a model, while its rounds still alternate
the models within one run, so that load coming and going reaches all of them alike.
"""

import multiprocessing
import traceback
from collections.abc import Callable

import torch

from .measure import time_calls


def worker_context() -> multiprocessing.context.BaseContext:
    """
    Where workers start: forked from a server process that has imported torch and the benchmark's models and
    nothing else, so that each worker starts in a heap no workload has touched, in milliseconds rather than the
    seconds of a fresh interpreter's imports (which a platform without fork pays: spawn).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["benchmarks.workloads"])  # read when the server starts, the first worker's
    return context


class InOwnProcess:
    """
    The workload `build()` returns (a `workloads.TrainingStep`, `Scoring` or `Decoding`), built in a process of its
    own (`worker_context`) with `num_threads` torch threads, and timed there in blocks (`time_block`), with its peak
    memory (`peak_memory`). `build` is pickled to that process: a module-level function, or a `functools.partial` of
    one. Close it, or use it as a context manager, to end the process.
    """

    def __init__(self, build: Callable[[], object], num_threads: int):
        context = worker_context()
        self._connection, child_connection = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_connection, build, num_threads), daemon=True)
        self._process.start()
        child_connection.close()
        self.tokens, self.measures_memory = self._receive()

    @property
    def pid(self) -> int:
        return self._process.pid

    def time_block(self, warmup: int, count: int) -> list[float]:
        """`warmup` untimed calls, then `count` timed ones, in the workload's process: their wall times."""
        return self._request("time_block", warmup, count)

    def peak_memory(self) -> int:
        return self._request("peak_memory")

    def close(self) -> None:
        if self._process.is_alive():
            self._connection.send(("close",))
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _request(self, *message):
        try:
            self._connection.send(message)
        except OSError:  # a broken pipe: the worker has died
            self._raise_ended()
        return self._receive()

    def _receive(self):
        try:
            status, value = self._connection.recv()
        except (EOFError, OSError):  # closed or reset: the worker has died
            self._raise_ended()
        if status == "error":  # the worker has ended
            self._process.join()
            raise RuntimeError(f"The benchmark's worker process {self._process.pid} failed:\n{value}")
        return value

    def _raise_ended(self):
        self._process.join()
        raise RuntimeError(
            f"The benchmark's worker process {self._process.pid} ended with exit code {self._process.exitcode} "
            "(killed for memory? try a smaller --micro_batch)."
        ) from None


def _serve(connection, build: Callable[[], object], num_threads: int) -> None:
    """The worker process: build the workload, then answer requests until told to close."""
    torch.set_num_threads(num_threads)
    try:
        workload = build()
        connection.send(("ok", (workload.tokens, workload.measures_memory)))
        while (message := connection.recv())[0] != "close":
            if message[0] == "time_block":
                answer = time_calls(workload, workload.device, *message[1:])
            else:
                answer = workload.peak_memory()
            connection.send(("ok", answer))
    except Exception:
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()
