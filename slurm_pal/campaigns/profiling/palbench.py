"""The timed window the campaign benchmarks share (standard library only).

A campaign must measure what a job gets: the GPU in its sustained state (clocks settled at
the power cap, temperature climbing), not the first fraction of a second. On H100, 200 GEMMs
(0.3 s) read 4.7 % faster per GEMM than 20,000 and repeat 2.7x noisier than 20 s windows
(``shared/data/gpu-h100/README.md``). So a benchmark warms up for ``--warmup-s`` seconds,
prints ``PAL_MEASURE_START`` (the runner samples NVML from there on), then times either a
window of ``--measure-s`` seconds or exactly ``--iters`` iterations, and reports
``PAL_DURATION_S`` = seconds per iteration over the window.

Defaults come from ``PAL_WARMUP_S``/``PAL_MEASURE_S`` (the campaign runner sets them from
the plan, i.e. ``[campaign] warmup_s/measure_s``), else 10 s and 20 s.

GPU work is asynchronous: ``step()`` only queues an iteration, ``sync()`` waits for the
queue. The loop synchronises after chunks of about a quarter second, so the clock is read
between finished iterations and the timed window is a whole number of them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_WARMUP_S = 10.0
DEFAULT_MEASURE_S = 20.0
MIN_WARMUP_ITERS = 3
CHUNK_TARGET_S = 0.25
MEASURE_START = "PAL_MEASURE_START"


def env_seconds(name: str, default: float) -> float:
    """A seconds value from the environment; a bad one stops the benchmark with exit 2."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        print(f"error: {name}={text!r} is not a number of seconds >= 0", file=sys.stderr)
        raise SystemExit(2)
    return value


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """``--warmup-s``, ``--measure-s`` and ``--iters`` with the environment's defaults."""
    warmup = env_seconds("PAL_WARMUP_S", DEFAULT_WARMUP_S)
    measure = env_seconds("PAL_MEASURE_S", DEFAULT_MEASURE_S)
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=warmup,
        help=f"Seconds of warm-up before the timed window (default: $PAL_WARMUP_S, else "
        f"{DEFAULT_WARMUP_S:g}); at least {MIN_WARMUP_ITERS} iterations.",
    )
    parser.add_argument(
        "--measure-s",
        type=float,
        default=measure,
        help=f"Seconds of the timed window (default: $PAL_MEASURE_S, else {DEFAULT_MEASURE_S:g}).",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=None,
        help="Time exactly this many iterations instead of --measure-s seconds.",
    )


def check_window_arguments(args: argparse.Namespace) -> str:
    """A problem with the window options, or ''."""
    if not (math.isfinite(args.warmup_s) and args.warmup_s >= 0):
        return f"--warmup-s must be >= 0, got {args.warmup_s}"
    if args.iters is None and not (math.isfinite(args.measure_s) and args.measure_s > 0):
        return f"--measure-s must be > 0, got {args.measure_s}"
    if args.iters is not None and args.iters < 1:
        return f"--iters must be >= 1, got {args.iters}"
    return ""


@dataclass(frozen=True)
class Window:
    """What the timed window measured."""

    iterations: int
    seconds: float
    warmup_iterations: int
    warmup_seconds: float

    @property
    def per_iteration_s(self) -> float:
        return self.seconds / self.iterations


def run_window(
    step: Callable[[], object],
    sync: Callable[[], object],
    *,
    warmup_s: float,
    measure_s: float,
    iters: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    emit: Callable[[str], None] | None = None,
) -> Window:
    """Warm up, announce the window, time it; see the module docstring."""
    say = emit or (lambda line: print(line, flush=True))
    # Warm-up: chunks double until they take about CHUNK_TARGET_S, so the first (slow)
    # iterations do not set the chunk size.
    done, chunk, per_step = 0, 1, 0.0
    start = clock()
    while True:
        chunk_start = clock()
        for _ in range(chunk):
            step()
        sync()
        now = clock()
        done += chunk
        per_step = (now - chunk_start) / chunk
        if done >= MIN_WARMUP_ITERS and now - start >= warmup_s:
            break
        ideal = int(CHUNK_TARGET_S / per_step) if per_step > 0 else chunk * 2
        chunk = max(1, min(chunk * 2, ideal))
    warmup_seconds = clock() - start
    chunk = max(1, int(CHUNK_TARGET_S / per_step)) if per_step > 0 else 1

    say(MEASURE_START)
    count = 0
    begin = clock()
    while True:
        n = chunk if iters is None else min(chunk, iters - count)
        for _ in range(n):
            step()
        sync()
        count += n
        if (iters is not None and count >= iters) or (
            iters is None and clock() - begin >= measure_s
        ):
            break
    elapsed = clock() - begin
    return Window(count, elapsed, done, warmup_seconds)


def report(window: Window, uuid: str | None, emit: Callable[[str], None] | None = None) -> None:
    """The contract lines: PAL_DURATION_S is seconds per iteration (what collect reads)."""
    say = emit or (lambda line: print(line, flush=True))
    if uuid:
        say(f"PAL_GPU_UUID={uuid}")
    say(f"PAL_ITERATIONS={window.iterations}")
    say(f"PAL_MEASURED_S={window.seconds:.6f}")
    say(f"PAL_DURATION_S={window.per_iteration_s:.9g}")


def uuid_text(raw: object) -> str | None:
    """A device UUID from whatever the framework returns (str, bytes or a UUID object)."""
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray):
        text = bytes(raw).hex()
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"
    else:
        text = str(raw)
    return text if text.startswith("GPU-") else f"GPU-{text}"
