"""
Run `twotower.training.train` under the accelerate config's FSDP or DeepSpeed plugin on CPU processes (gloo).

On CPU, Accelerate builds the plugin from the variables `accelerate launch` sets (ACCELERATE_USE_FSDP and FSDP_*,
ACCELERATE_USE_DEEPSPEED and ACCELERATE_DEEPSPEED_*) and then drops it: AcceleratorState chooses FSDP only on
accelerator devices (MULTI_GPU, ...) and DeepSpeed only `not cpu`, so the run silently becomes MULTI_CPU DDP. This
launcher lets AcceleratorState build the CPU state, then puts the plugin back in force, as the GPU path would have:
the package's own FSDP and DeepSpeed code then runs on a machine without GPUs. Launch it like the training module,
with the training's own --cpu (accelerate launch's --cpu starts one process and sets none of the plugin variables):
    accelerate launch --config_file training/accelerate_configs/fsdp.yaml --num_processes 2 --mixed_precision no \
        tests/training/launch_forced_plugin.py --recipe tiny --cpu true ...
"""

import os

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_built_state = AcceleratorState.__init__


def _state_with_the_launched_plugin(self, mixed_precision=None, cpu=False, dynamo_plugin=None,
                                    deepspeed_plugin=None, fsdp_plugin=None, *args, **kwargs):
    """AcceleratorState.__init__, then the FSDP or DeepSpeed plugin Accelerator built from the environment, in force."""
    _built_state(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *args, **kwargs)
    if self.distributed_type != DistributedType.MULTI_CPU:  # already forced, or not a CPU launch
        return
    if fsdp_plugin is not None:
        # What AcceleratorState does on MULTI_GPU
        self.distributed_type = DistributedType.FSDP
        if self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin
    elif deepspeed_plugin is not None:
        # What AcceleratorState and PartialState do with ACCELERATE_USE_DEEPSPEED off CPU: DeepSpeed's comm wraps
        # the gloo group PartialState opened, the plugin takes the precision and the state's own becomes "no"
        from deepspeed import comm

        comm.init_distributed(dist_backend=self.backend, auto_mpi_discovery=False)
        self.distributed_type = DistributedType.DEEPSPEED
        deepspeed_plugin.set_mixed_precision(self._mixed_precision)
        deepspeed_plugin.select(_from_accelerator_state=True)
        self.deepspeed_plugins = deepspeed_plugin
        self._mixed_precision = "no"
    else:
        return
    PartialState._shared_state["distributed_type"] = self.distributed_type
    print(f"launch_forced_plugin: rank {self.process_index} forced {self.distributed_type} on {self.device} "
          f"({self.backend})", flush=True)


def main():
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" and (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true"
    ):
        raise SystemExit("launch_forced_plugin: no FSDP or DeepSpeed plugin was launched (use an FSDP or DeepSpeed "
                         "accelerate config, without accelerate launch's --cpu)")
    AcceleratorState.__init__ = _state_with_the_launched_plugin
    from twotower.training.utils.cli import run
    from twotower.training.train import main as train_main

    run(train_main)


if __name__ == "__main__":
    main()
