"""Representative compute-bound benchmark: a timed GEMM loop (PyTorch, else CuPy).

Warms up for ``--warmup-s`` seconds, prints ``PAL_MEASURE_START``, then times ``--measure-s``
seconds of back-to-back GEMMs (or exactly ``--iters`` of them) and prints
``PAL_DURATION_S=<seconds per GEMM>`` (higher = slower GPU), and ``PAL_GPU_UUID=<uuid>`` when
the framework reports the device's UUID (see ``palbench.py`` and profiling/README.md). Runs on
the first visible CUDA device: the campaign runner sets ``CUDA_VISIBLE_DEVICES`` to the GPU it
measures. Without PyTorch or CuPy it says so and exits 3.

Ran on an H200 in this form (tests/fixtures/gpu-h200): repeat CV 0.04 % at the default window
with PyTorch and with CuPy (cuBLAS either way, 1.71 and 1.73 ms per GEMM on two GPUs).
"""

from __future__ import annotations

import argparse
import sys

import palbench

EXIT_NO_FRAMEWORK = 3


def run_torch(torch, size: int, dtype: str, args: argparse.Namespace):
    dev = torch.device("cuda:0")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a = torch.randn(size, size, device=dev, dtype=dt)
    b = torch.randn(size, size, device=dev, dtype=dt)
    c = torch.empty(size, size, device=dev, dtype=dt)
    window = palbench.run_window(
        lambda: torch.mm(a, b, out=c),
        lambda: torch.cuda.synchronize(dev),
        warmup_s=args.warmup_s,
        measure_s=args.measure_s,
        iters=args.iters,
    )
    try:
        uuid = palbench.uuid_text(torch.cuda.get_device_properties(dev).uuid)
    except Exception:
        uuid = None
    return window, uuid


def run_cupy(cp, size: int, dtype: str, args: argparse.Namespace):
    dt = {"fp16": cp.float16, "bf16": cp.float32, "fp32": cp.float32}[dtype]
    a = cp.random.standard_normal((size, size)).astype(dt)
    b = cp.random.standard_normal((size, size)).astype(dt)
    c = cp.empty((size, size), dtype=dt)
    window = palbench.run_window(
        lambda: cp.matmul(a, b, out=c),
        lambda: cp.cuda.Device(0).synchronize(),
        warmup_s=args.warmup_s,
        measure_s=args.measure_s,
        iters=args.iters,
    )
    try:
        uuid = palbench.uuid_text(cp.cuda.runtime.getDeviceProperties(0).get("uuid"))
    except Exception:
        uuid = None
    return window, uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Timed GEMM loop (compute-bound class).")
    parser.add_argument("--size", type=int, default=8192, help="Square matrix size.")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16")
    palbench.add_window_arguments(parser)
    args = parser.parse_args(argv)
    problem = palbench.check_window_arguments(args)
    if problem:
        parser.error(problem)
    try:
        import torch

        if not torch.cuda.is_available():
            print("error: PyTorch is installed but sees no CUDA device", file=sys.stderr)
            return EXIT_NO_FRAMEWORK
        window, uuid = run_torch(torch, args.size, args.dtype, args)
    except ImportError:
        try:
            import cupy
        except ImportError:
            print(
                "error: the GEMM benchmark needs PyTorch or CuPy on this node and neither "
                "imports; install one into the Python the campaign uses (plan --python), or "
                "give the class its own command (plan --command CLASS=CMD)",
                file=sys.stderr,
            )
            return EXIT_NO_FRAMEWORK
        window, uuid = run_cupy(cupy, args.size, args.dtype, args)
    palbench.report(window, uuid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
