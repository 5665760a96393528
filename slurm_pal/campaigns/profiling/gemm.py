"""Representative compute-bound benchmark: a timed GEMM loop (PyTorch, else CuPy).

Prints ``PAL_DURATION_S=<seconds>`` for a fixed amount of work (higher = slower GPU) and
``PAL_GPU_UUID=<uuid>`` when the framework reports the device's UUID. Runs on the first
visible CUDA device: the campaign runner sets ``CUDA_VISIBLE_DEVICES`` to the GPU it measures.
Without PyTorch or CuPy it says so and exits 3.

Not yet run on a GPU here (the development machines have none): the timing path follows the
frameworks' documented APIs; the testbed session checks it on real hardware.
"""

from __future__ import annotations

import argparse
import sys
import time

EXIT_NO_FRAMEWORK = 3


def _uuid_text(raw: object) -> str | None:
    """A device UUID from whatever the framework returns (str, bytes or a UUID object)."""
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray):
        text = bytes(raw).hex()
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
    else:
        text = str(raw)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def run_torch(torch, size: int, iters: int, dtype: str) -> tuple[float, str | None]:
    dev = torch.device("cuda:0")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a = torch.randn(size, size, device=dev, dtype=dt)
    b = torch.randn(size, size, device=dev, dtype=dt)
    for _ in range(3):  # warm-up: clocks ramp, cuBLAS picks its kernel
        torch.mm(a, b)
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    for _ in range(iters):
        torch.mm(a, b)
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - start
    try:
        uuid = _uuid_text(torch.cuda.get_device_properties(dev).uuid)
    except Exception:
        uuid = None
    return elapsed, uuid


def run_cupy(cp, size: int, iters: int, dtype: str) -> tuple[float, str | None]:
    dt = {"fp16": cp.float16, "bf16": cp.float32, "fp32": cp.float32}[dtype]
    a = cp.random.standard_normal((size, size)).astype(dt)
    b = cp.random.standard_normal((size, size)).astype(dt)
    for _ in range(3):
        cp.matmul(a, b)
    cp.cuda.Device(0).synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        cp.matmul(a, b)
    cp.cuda.Device(0).synchronize()
    elapsed = time.perf_counter() - start
    try:
        uuid = _uuid_text(cp.cuda.runtime.getDeviceProperties(0).get("uuid"))
    except Exception:
        uuid = None
    return elapsed, uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Timed GEMM loop (compute-bound class).")
    parser.add_argument("--size", type=int, default=8192, help="Square matrix size.")
    parser.add_argument("--iters", type=int, default=200, help="Timed multiplications.")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16")
    args = parser.parse_args(argv)
    try:
        import torch

        if not torch.cuda.is_available():
            print("error: PyTorch is installed but sees no CUDA device", file=sys.stderr)
            return EXIT_NO_FRAMEWORK
        elapsed, uuid = run_torch(torch, args.size, args.iters, args.dtype)
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
        elapsed, uuid = run_cupy(cupy, args.size, args.iters, args.dtype)
    if uuid:
        print(f"PAL_GPU_UUID={uuid}")
    print(f"PAL_DURATION_S={elapsed:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
