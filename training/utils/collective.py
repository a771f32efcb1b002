"""
Failing together: when one process of a multi-process run meets an error, every process raises it, so that none
waits forever at the next collective operation (a barrier, a gradient all-reduce).
"""

from accelerate.utils import broadcast_object_list, gather_object

from .errors import TwoTowerUserError


def _let_workers_free_their_tensors(accelerator) -> None:
    """
    A barrier after an object collective. gloo's worker threads need the GIL to free the collective's Python tensors;
    waiting at the barrier releases it. Without it, a process group torn down soon after (the DDP model freed at the
    end of a run) can hold the GIL while it waits for those threads: a deadlock, seen in 3 of 6 tiny 2-process runs.
    """
    accelerator.wait_for_everyone()


def raise_together(accelerator, error: Exception | None) -> None:
    """
    Every process calls this with the error it met (or None); all raise when any did. The process that met the
    error raises it as it is, the others a copy of its message: a TwoTowerUserError for a user error, else a
    RuntimeError naming the process.
    """
    failures = [] if error is None else [(accelerator.process_index, isinstance(error, TwoTowerUserError), str(error))]
    if accelerator.num_processes > 1:
        failures = gather_object(failures)
        _let_workers_free_their_tensors(accelerator)
    if error is not None:
        raise error
    if failures:
        process_index, is_user_error, message = failures[0]
        if is_user_error:
            raise TwoTowerUserError(message)
        raise RuntimeError(f"process {process_index} failed: {message}")


def on_main_process(accelerator, function):
    """Run `function()` on the main process only; every process returns its result, or raises its error."""
    result, error = None, None
    if accelerator.is_main_process:
        try:
            result = function()
        except Exception as caught:  # the other processes must learn of any failure, not only of user errors
            error = caught
    raise_together(accelerator, error)
    if accelerator.num_processes > 1:
        shared = [result]
        broadcast_object_list(shared)
        _let_workers_free_their_tensors(accelerator)
        result = shared[0]
    return result


def end_processes(accelerator) -> None:
    """
    The end of a run: free what `prepare` wrapped, wait for every process, then destroy the process group (and end
    the trackers). Freed after the group instead, the last DDP module would destroy the group itself, joining gloo's
    worker threads while holding the GIL one of them may still need: a hang at exit, seen in ~1 of 10 2-process runs.
    """
    accelerator.free_memory()
    accelerator.wait_for_everyone()
    accelerator.end_training()
