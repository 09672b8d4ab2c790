"""make validate-gpu: kfit's assumptions checked on a real device, with the figures.

    report.py         Result and Context, running checks under a time budget each (a failing
                      check never stops the others), the table, the summary line, the JSON
                      document, its path and the docs/validation/README.md index
    measure.py        the device calls validation makes (CudaDevice: peaks, free memory, the
                      squeezing allocation, the cuBLAS workspace) and the measured peak of one
                      training step: torch.profiler on a CPU, the caching allocator on CUDA
    detection.py      nvidia-smi against lib.hardware.detect(); NVML telemetry sampled under load
    memory_check.py   predicted against measured peaks, each device-overhead term against what
                      was measured, and the constants those figures suggest
    budget.py         planning for a squeezed free memory; recovering from a real out-of-memory
    compile_check.py  torch.compile on against off throughput, against compile AUTO
    mfu_check.py      GPT-2 124M compiled: measured MFU against a floor, beside the predicted one
    steptime_check.py predicted against measured step time, before and after calibration
    sweep_check.py    the plan's micro-batch against its neighbours, timed as real steps
    loop_compare.py   kfit's trainer against a minimal loop, interleaved, in samples/s: the
                      comparison make bench-loop runs on the CPU and loop_check.py on the device
    loop_check.py     kfit's trainer against a minimal loop on the same device
    vocab.py          GPT-2 on GPT-2's 50,257-token vocabulary (a synthetic tokenized corpus)
    torchrun.py       a one-process torchrun run (NCCL on GPUs, gloo on CPUs), and its worker
    suite.py          which checks run for a device and mode, with their time budgets

On a GPU every check measures; with DEVICE=cpu the checks a CPU can run run a
short version (the test suite runs it) and the CUDA-only ones are skipped with
the reason. This package imports nothing here, so the torchrun worker starts light.
"""
