"""Representative memory-bound benchmark: a timed STREAM-triad loop (PyTorch, else CuPy).

``a = b + s * c`` over arrays far larger than the L2 cache, so DRAM bandwidth sets the pace.
Warms up for ``--warmup-s`` seconds, prints ``PAL_MEASURE_START``, then times ``--measure-s``
seconds of triads (or exactly ``--iters``) and prints ``PAL_DURATION_S=<seconds per triad>``
(higher = slower GPU), and ``PAL_GPU_UUID=<uuid>`` when the framework reports it (see
``palbench.py`` and profiling/README.md). Runs on the first visible CUDA device (the campaign
runner sets ``CUDA_VISIBLE_DEVICES``). Without PyTorch or CuPy it says so and exits 3.

Ran on an H200 in this form (tests/fixtures/gpu-h200): repeat CV 0.01 % at the default window.
PyTorch's triad moved 4.36 TB/s; the CuPy ElementwiseKernel below only 2.53 TB/s, so on a node
without PyTorch this benchmark is not bandwidth-bound (profiling/README.md).
"""

from __future__ import annotations

import argparse
import sys

import palbench

EXIT_NO_FRAMEWORK = 3


def run_torch(torch, n: int, args: argparse.Namespace):
    dev = torch.device("cuda:0")
    b = torch.rand(n, device=dev)
    c = torch.rand(n, device=dev)
    a = torch.empty_like(b)
    window = palbench.run_window(
        lambda: torch.add(b, c, alpha=3.0, out=a),
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


def run_cupy(cp, n: int, args: argparse.Namespace):
    b = cp.random.random(n, dtype=cp.float32)
    c = cp.random.random(n, dtype=cp.float32)
    a = cp.empty_like(b)
    triad = cp.ElementwiseKernel("T b, T c", "T a", "a = b + (T)3.0 * c", "pal_triad")
    window = palbench.run_window(
        lambda: triad(b, c, a),
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
    parser = argparse.ArgumentParser(description="Timed STREAM triad (memory-bound class).")
    parser.add_argument(
        "--elements", type=int, default=1 << 28, help="Elements per array (float32)."
    )
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
        window, uuid = run_torch(torch, args.elements, args)
    except ImportError:
        try:
            import cupy
        except ImportError:
            print(
                "error: the STREAM benchmark needs PyTorch or CuPy on this node and neither "
                "imports; install one into the Python the campaign uses (plan --python), or "
                "give the class its own command (plan --command CLASS=CMD)",
                file=sys.stderr,
            )
            return EXIT_NO_FRAMEWORK
        window, uuid = run_cupy(cupy, args.elements, args)
    palbench.report(window, uuid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
