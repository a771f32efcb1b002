"""What a launch gives a run and what the machine does with it: the checks of the launch (launch_checks), FSDP
sharding, compilation, the library notices kept off the output, and throughput (FLOPs per token, MFU)."""
