"""The peers in the simulator: FFT-PM, SJF-BSBF, SJF-FFS, SJF, GIMBAL-style packing,
and their combinations with PAL (``pal-fft``: PAL under FFT's fair scheduler; ``pal-share``:
PM-aware sharing). Each is a scheduler and a placement at once, selected by one name.

``PEERS`` maps the name to what it is; :func:`simulate_peer` runs one. The engine's
:func:`~slurm_pal.sim.engine.simulate` dispatches here for these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_pal.core.workload import SimJob
from slurm_pal.sim.metrics import SimResult
from slurm_pal.sim.peers.fft import FftPal, FftPm, RoundProblem, gpu_types, solve_round
from slurm_pal.sim.peers.gimbal import GimbalPacking, squeeze
from slurm_pal.sim.peers.interference import InterferenceTable, compute_share
from slurm_pal.sim.peers.sharing import SharingPolicy, SharingRun, share_or_wait
from slurm_pal.sim.peers.sjf import PalShare, SjfBsbf, SjfExclusive, SjfFfs
from slurm_pal.sim.variability import SimGpus

__all__ = [
    "PEERS",
    "InterferenceTable",
    "RoundProblem",
    "compute_share",
    "gpu_types",
    "share_or_wait",
    "simulate_peer",
    "solve_round",
    "squeeze",
]

PEERS: Mapping[str, str] = {
    "fft-pm": "FFT's round MILP over PM bins, fairness compensation, switching penalty",
    "sjf-bsbf": "non-preemptive SJF, 2 jobs/GPU, share-or-wait (best sharing benefit first)",
    "sjf-ffs": "non-preemptive SJF, 2 jobs/GPU, first-fit sharing (SJF-BSBF's baseline)",
    "sjf": "non-preemptive SJF, exclusive GPUs (control for the sharing peers)",
    "gimbal": "GIMBAL-style packing rules + static MPS squeeze, under the --scheduler order",
    "pal-fft": "PAL placement under FFT's fair round scheduler",
    "pal-share": "PAL placement; memory-bound jobs share GPUs slow for compute (share-or-wait)",
}
"""Peer name -> one line (the CLI lists them)."""


def simulate_peer(
    jobs: Sequence[SimJob],
    gpus: SimGpus,
    name: str,
    *,
    scheduler: str = "fifo",
    round_seconds: float = 360.0,
    locality_penalty: float = 1.7,
    migration_seconds: float = 30.0,
    xi: float | None = None,
    class_order: Sequence[str] | None = None,
    max_time: float = 10 * 365 * 86400.0,
) -> SimResult:
    """Run one peer. ``scheduler`` orders jobs for ``gimbal`` and ``pal-share`` (fifo, or srtf
    = shortest work first); the SJF peers are SJF and the FFT ones their own scheduler.
    ``xi`` overrides every pair's interference factor (SJF-BSBF's Fig. 6b sweep)."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; valid: {', '.join(PEERS)}")
    order = tuple(class_order or gpus.classes)
    if name in ("fft-pm", "pal-fft"):
        runner = FftPm if name == "fft-pm" else FftPal
        return runner(
            jobs,
            gpus,
            locality_penalty=locality_penalty,
            round_seconds=round_seconds,
            migration_seconds=migration_seconds,
            class_order=order,
        ).run(max_time)
    table = InterferenceTable(order, xi=xi)
    order_by = "srtf" if scheduler == "srtf" else "fifo"
    policy: SharingPolicy = {  # type: ignore[assignment]
        "sjf-bsbf": lambda: SjfBsbf(name, table),
        "sjf-ffs": lambda: SjfFfs(name, table),
        "sjf": lambda: SjfExclusive(name, table),
        "gimbal": lambda: GimbalPacking(name, table, order_by),
        "pal-share": lambda: PalShare(name, table, order_by),
    }[name]()
    run = SharingRun(jobs, gpus, policy, locality_penalty=locality_penalty, class_order=order)
    return run.run(max_time)
