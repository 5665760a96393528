"""The simulated cluster's GPUs: what the policies see (binned PM-scores) and what the jobs feel
(each GPU's true slowdown per class).

Two ways to give N simulated GPUs their per-class values (pure: callers pass data, not paths):

- :func:`measured_gpus` (corrected mode): each simulated GPU *is* one GPU of the measured cluster,
  drawn without repetition (seeded), so its values in all classes come from one physical GPU.
  GPUs measured in more classes are drawn first (the Longhorn files measure different GPU
  subsets per benchmark); a class the drawn GPU was not measured for falls back to the median
  bin, as in the live advisor. Placement sees the campaign's PM-scores (bins); progress uses the
  GPU's own normalized median (the truth the bins approximate).
- :func:`artifact_gpus` (PAL's artifact): every GPU's value of every class is an independent
  ``random.choice`` among the class file's raw rows normalized by the file median, Python
  ``random`` seeded 42, drawn GPU by GPU and class by class in ``profiles.json`` order (exactly
  what PAL's ``_get_machine_slowdowns`` ends up doing, because it looks an int up among string
  UUIDs). Placement sees those draws binned the way PAL's policies bin them (K = 2 plus one
  cluster per one-sided 3-sigma outlier, :class:`~slurm_pal.core.binning.PMBinner` with
  ``pal_artifact=True``); progress uses the raw draws (``job_pm_penalty`` in PAL's manager).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from slurm_pal.core.binning import PMBinner
from slurm_pal.core.cluster import GpuSpec
from slurm_pal.core.variability import VariabilityProfile

__all__ = [
    "SimGpus",
    "artifact_gpus",
    "few_slow_gpus",
    "measured_gpus",
    "sampled_gpus",
    "uniform_gpus",
]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class SimGpus:
    """Per class, one value per simulated GPU (GPU g is on node ``g // gpus_per_node``).

    ``placement_scores`` feed the policies (few distinct values: bins); ``true_slowdown`` is the
    factor a job's time stretches by on that GPU (progress rate = 1 / (max over its GPUs x L)).
    """

    n_nodes: int
    gpus_per_node: int
    placement_scores: Mapping[str, FloatArray]
    true_slowdown: Mapping[str, FloatArray]
    source: str = ""

    def __post_init__(self) -> None:
        n = self.n_gpus
        if self.n_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("a simulated cluster needs >= 1 node and >= 1 GPU per node")
        if set(self.placement_scores) != set(self.true_slowdown) or not self.placement_scores:
            raise ValueError("placement scores and true slowdowns must cover the same classes")
        for table in (self.placement_scores, self.true_slowdown):
            for name, values in table.items():
                array = np.asarray(values, dtype=float)
                if array.shape != (n,) or not np.all(np.isfinite(array)) or (array <= 0).any():
                    raise ValueError(f"class {name!r}: need {n} finite values > 0")

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.placement_scores)

    def node_name(self, node: int) -> str:
        return f"sim{node:04d}"

    def specs(self) -> list[GpuSpec]:
        """The GPUs as the placement core takes them (UUID ``sim-gpu-<g>``)."""
        return [
            GpuSpec(
                uuid=f"sim-gpu-{gpu:05d}",
                node=self.node_name(gpu // self.gpus_per_node),
                index=gpu % self.gpus_per_node,
                model="sim",
                scores={name: float(v[gpu]) for name, v in self.placement_scores.items()},
            )
            for gpu in range(self.n_gpus)
        ]


def uniform_gpus(
    classes: Sequence[str], n_nodes: int, gpus_per_node: int, value: float = 1.0
) -> SimGpus:
    """Every GPU alike (no variability): for tests and locality-only studies."""
    n = n_nodes * gpus_per_node
    table = {name: np.full(n, float(value)) for name in classes}
    return SimGpus(n_nodes, gpus_per_node, table, dict(table), source="uniform")


def artifact_gpus(
    raw_durations: Mapping[str, Sequence[float]],
    n_nodes: int,
    gpus_per_node: int,
    *,
    seed: int = 42,
    binner: PMBinner | None = None,
) -> SimGpus:
    """PAL's artifact draws. ``raw_durations`` maps class -> the class file's ``perf`` column in
    file order (classes in ``profiles.json`` order: A, B, C, D; two classes may share a file and
    still get independent draws, as in PAL)."""
    rng = random.Random(seed)
    normalized = {}
    for name, values in raw_durations.items():
        array = np.asarray(values, dtype=float)
        if array.size == 0 or not np.all(array > 0):
            raise ValueError(f"class {name!r}: need raw durations > 0")
        normalized[name] = (array / np.median(array)).tolist()
    n = n_nodes * gpus_per_node
    draws: dict[str, list[float]] = {name: [] for name in normalized}
    for _gpu in range(n):
        for name, values in normalized.items():
            draws[name].append(rng.choice(values))
    template = binner if binner is not None else PMBinner(pal_artifact=True)
    true = {name: np.array(values) for name, values in draws.items()}
    scores = {
        name: PMBinner(**template.get_params()).fit(values).transform(values)
        for name, values in true.items()
    }
    return SimGpus(n_nodes, gpus_per_node, scores, true, source=f"pal-artifact seed {seed}")


def measured_gpus(
    profile: VariabilityProfile,
    n_nodes: int,
    gpus_per_node: int,
    *,
    seed: int = 0,
    classes: Sequence[str] | None = None,
) -> SimGpus:
    """Corrected mode: draw ``n_nodes x gpus_per_node`` measured GPUs without repetition.

    GPUs measured in more of ``classes`` come first, ties in seeded random order. When the
    simulated cluster is larger than the measured one, the measured GPUs are reused in a fresh
    random order (said in ``source``)."""
    gpus = profile.gpus
    names = list(classes) if classes is not None else list(profile.classes)
    unknown = [c for c in names if c not in profile.classes]
    if unknown:
        raise ValueError(f"the profile has no class {', '.join(unknown)}")
    part = gpus[gpus["job_class"].isin(names)]
    score = part.pivot(index="uuid", columns="job_class", values="pm_score")[names]
    truth = part.pivot(index="uuid", columns="job_class", values="norm_value")[names]
    measured = part.pivot(index="uuid", columns="job_class", values="measured")[names]
    truth = truth.where(measured.astype(bool), score)  # unmeasured: the median bin's score
    rng = np.random.default_rng(seed)
    n = n_nodes * gpus_per_node
    uuids = np.array(score.index)
    coverage = measured.astype(bool).sum(axis=1).to_numpy()
    picks: list[int] = []
    while len(picks) < n:
        shuffle = rng.permutation(len(uuids))
        ranked = shuffle[np.argsort(-coverage[shuffle], kind="stable")]
        picks.extend(ranked[: n - len(picks)].tolist())
    reused = n > len(uuids)
    scores = {c: score[c].to_numpy(dtype=float)[picks] for c in names}
    true = {c: truth[c].to_numpy(dtype=float)[picks] for c in names}
    source = f"measured GPUs, seed {seed}" + (" (reused: cluster > campaign)" if reused else "")
    return SimGpus(n_nodes, gpus_per_node, scores, true, source=source)


def _binned(true: Mapping[str, FloatArray], binner: PMBinner | None) -> dict[str, FloatArray]:
    """What placement sees of ``true``: each class binned as a campaign would be."""
    template = binner if binner is not None else PMBinner()
    return {
        name: PMBinner(**template.get_params()).fit(values).transform(values)
        for name, values in true.items()
    }


def sampled_gpus(
    per_gpu: Mapping[str, Sequence[float]],
    n_nodes: int,
    gpus_per_node: int,
    *,
    seed: int = 0,
    source: str = "sampled",
    binner: PMBinner | None = None,
) -> SimGpus:
    """A cluster larger than the few GPUs measured: each simulated GPU is one measured GPU
    (its values in every class together), drawn with repetition. ``per_gpu`` maps class ->
    one normalized value per measured GPU, in the same GPU order for every class."""
    lengths = {len(values) for values in per_gpu.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError("every class needs one value per measured GPU, in one GPU order")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, lengths.pop(), n_nodes * gpus_per_node)
    true = {name: np.asarray(values, dtype=float)[picks] for name, values in per_gpu.items()}
    return SimGpus(
        n_nodes, gpus_per_node, _binned(true, binner), true, source=f"{source}, seed {seed}"
    )


def few_slow_gpus(
    classes: Sequence[str],
    n_nodes: int,
    gpus_per_node: int,
    *,
    seed: int = 0,
    share: float = 0.03,
    slowdown: tuple[float, float] = (2.0, 3.0),
    sensitivity: Sequence[float] | None = None,
    noise: float = 0.01,
) -> SimGpus:
    """A site where a few GPUs are far slower (a failed fan, hardware slowdown): ``share`` of
    them (at least one) at ``slowdown`` (uniform) for the first, most compute-bound class,
    the others feeling ``sensitivity`` of it (default: 1, 0.5, 0.1, 0 ... for the classes in
    order); every GPU also has ``noise`` (log-normal sigma) of ordinary spread."""
    n = n_nodes * gpus_per_node
    weights = list(sensitivity) if sensitivity is not None else [1.0, 0.5, 0.1, 0.0]
    weights += [0.0] * (len(classes) - len(weights))
    rng = np.random.default_rng(seed)
    slow = rng.choice(n, max(1, round(share * n)), replace=False)
    factor = rng.uniform(*slowdown, slow.size)
    true: dict[str, FloatArray] = {}
    for name, weight in zip(classes, weights, strict=False):
        values = rng.lognormal(0.0, noise, n)
        values[slow] *= 1.0 + (factor - 1.0) * weight
        true[name] = values / np.median(values)
    return SimGpus(
        n_nodes,
        gpus_per_node,
        _binned(true, None),
        true,
        source=f"{slow.size} of {n} GPUs {slowdown[0]:g}-{slowdown[1]:g}x, seed {seed}",
    )
