"""`distro-node doctor`: can this machine keep up with a run?

- ``cli``      the sub-command: flags, the order of the measurements, exit codes.
- ``link``     the coordinator: the run's definition and the measured transfer rate.
- ``machine``  CPU, memory, CUDA, MLX; usable and peak memory.
- ``measure``  real training steps of the run's model (torch).
- ``verdict``  the report, a round's bytes and the verdict (pure arithmetic).
"""
