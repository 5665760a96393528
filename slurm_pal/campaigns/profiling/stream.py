"""Representative memory-bound benchmark: a timed STREAM-triad loop (PyTorch, else CuPy).

``a = b + s * c`` over arrays far larger than the L2 cache, so DRAM bandwidth sets the pace.
Prints ``PAL_DURATION_S=<seconds>`` for a fixed amount of work (higher = slower GPU) and
``PAL_GPU_UUID=<uuid>`` when the framework reports it. Runs on the first visible CUDA device
(the campaign runner sets ``CUDA_VISIBLE_DEVICES``). Without PyTorch or CuPy it says so and
exits 3.

Not yet run on a GPU here (the development machines have none): the timing path follows the
frameworks' documented APIs; the testbed session checks it on real hardware.
"""

from __future__ import annotations

import argparse
import sys
import time

EXIT_NO_FRAMEWORK = 3


def _uuid_text(raw: object) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray):
        text = bytes(raw).hex()
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
    else:
        text = str(raw)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def run_torch(torch, n: int, iters: int) -> tuple[float, str | None]:
    dev = torch.device("cuda:0")
    b = torch.rand(n, device=dev)
    c = torch.rand(n, device=dev)
    a = torch.empty_like(b)
    for _ in range(3):
        torch.add(b, c, alpha=3.0, out=a)
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    for _ in range(iters):
        torch.add(b, c, alpha=3.0, out=a)
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - start
    try:
        uuid = _uuid_text(torch.cuda.get_device_properties(dev).uuid)
    except Exception:
        uuid = None
    return elapsed, uuid


def run_cupy(cp, n: int, iters: int) -> tuple[float, str | None]:
    b = cp.random.random(n, dtype=cp.float32)
    c = cp.random.random(n, dtype=cp.float32)
    a = cp.empty_like(b)
    triad = cp.ElementwiseKernel("T b, T c", "T a", "a = b + (T)3.0 * c", "pal_triad")
    for _ in range(3):
        triad(b, c, a)
    cp.cuda.Device(0).synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        triad(b, c, a)
    cp.cuda.Device(0).synchronize()
    elapsed = time.perf_counter() - start
    try:
        uuid = _uuid_text(cp.cuda.runtime.getDeviceProperties(0).get("uuid"))
    except Exception:
        uuid = None
    return elapsed, uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Timed STREAM triad (memory-bound class).")
    parser.add_argument(
        "--elements", type=int, default=1 << 28, help="Elements per array (float32)."
    )
    parser.add_argument("--iters", type=int, default=200, help="Timed triads.")
    args = parser.parse_args(argv)
    try:
        import torch

        if not torch.cuda.is_available():
            print("error: PyTorch is installed but sees no CUDA device", file=sys.stderr)
            return EXIT_NO_FRAMEWORK
        elapsed, uuid = run_torch(torch, args.elements, args.iters)
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
        elapsed, uuid = run_cupy(cupy, args.elements, args.iters)
    if uuid:
        print(f"PAL_GPU_UUID={uuid}")
    print(f"PAL_DURATION_S={elapsed:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
