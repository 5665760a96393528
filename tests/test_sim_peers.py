"""The peers on hand-worked cases: FFT's round program against brute force and on
its Table 1 example, SJF-BSBF's share-or-wait rule, GPU sharing in the engine, GIMBAL's rules,
finish-time fairness, and the CLI names."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from slurm_pal.core.workload import SimJob, poisson_workload
from slurm_pal.sim import ALL_PLACEMENTS, SimConfig, SimGpus, simulate, uniform_gpus
from slurm_pal.sim.metrics import JobOutcome, finish_time_fairness
from slurm_pal.sim.peers import (
    PEERS,
    InterferenceTable,
    RoundProblem,
    gpu_types,
    share_or_wait,
    solve_round,
    squeeze,
)


def job(name: str, submit: float, gpus: int, work: float, job_class: str = "A") -> SimJob:
    return SimJob(name, submit, gpus, work, job_class)


def ends(result) -> dict[str, float]:
    return {j.job_id: j.end for j in result.jobs}


# --- FFT-PM ------------------------------------------------------------------------------------


def brute_force(problem: RoundProblem) -> tuple[int, float]:
    """(K, min cost at K) over every assignment of each job to one of its pairs or none."""
    options: list[list[int | None]] = [[None] for _ in range(problem.jobs)]
    for k, (j, _) in enumerate(problem.pairs):
        options[j].append(k)
    best: tuple[int, float] = (-1, 0.0)
    for combo in itertools.product(*options):
        used = [k for k in combo if k is not None]
        load = [0] * len(problem.capacity)
        total = 0
        for k in used:
            j, kind = problem.pairs[k]
            total += problem.demand[j]
            if kind >= 0:
                load[kind] += problem.demand[j]
        if total > problem.total or any(a > b for a, b in zip(load, problem.capacity, strict=True)):
            continue
        cost = sum(problem.cost[k] for k in used)
        if total > best[0] or (total == best[0] and cost < best[1] - 1e-9):
            best = (total, cost)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_round_program_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n_jobs, capacity = rng.randint(1, 5), tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
    demand = tuple(rng.choice((1, 1, 2, 3, 4, 6)) for _ in range(n_jobs))
    pairs, cost = [], []
    for j in range(n_jobs):
        kinds = [i for i, c in enumerate(capacity) if c >= demand[j]] or [-1]
        for kind in kinds:
            pairs.append((j, kind))
            cost.append(rng.uniform(-5, 20))
    problem = RoundProblem(
        n_jobs, tuple(pairs), tuple(cost), demand, capacity, sum(capacity) + rng.randint(0, 2)
    )
    chosen = solve_round(problem)
    used = [problem.pairs.index((j, kind)) for j, kind in chosen.items()]
    k_t = sum(problem.demand[problem.pairs[k][0]] for k in used)
    expected_k, expected_cost = brute_force(problem)
    assert k_t == expected_k
    assert sum(problem.cost[k] for k in used) == pytest.approx(expected_cost, abs=1e-6)


def test_gpu_types_merge_bins_smaller_than_a_node() -> None:
    # bins 1.0 (5 GPUs), 1.1 (2 GPUs: merged into 1.0, the nearer), 2.0 (4 GPUs)
    scores = [1.0] * 5 + [1.1] * 2 + [2.0] * 4
    assert gpu_types(scores, 4) == [list(range(7)), list(range(7, 11))]


def test_fft_table1_two_jobs_hand_worked() -> None:
    # FFT Table 1: two identical jobs of 16 epochs, GPU0 at 8 epochs/min, GPU1 at 1: 2 min of
    # work on GPU0 (slowdown 1), GPU1 8x slower; 1-min rounds, free migration, W = 2 rounds.
    # t=0: each job costs d W / theta: 2 on GPU0, 16 on GPU1 -> one on each (x0 on GPU0).
    # t=1: x0 has 1 round left, x1 1.875. Keep: (1 + 1) + (1/8/1.875 + 15) = 17.07; swap:
    #      (1/1.875 + 1.875) + (1/8 + 8) = 10.53 (rho is still 0: mu(0) = 0) -> swap.
    # t=2: both have 0.875 left (tie); one finishes on GPU0 at 2.875 min, the other does 1/8
    # t=3: and finishes on GPU0 after 0.75 min: 3.75 min. Total 6.625 min: between Table 1's
    #      optimum (5.75, I1 waits on GPU1 then migrates once) and Gavel's bound (64/9 = 7.11):
    #      the per-round program is myopic.
    gpus = SimGpus(2, 1, {"A": np.array([1.0, 8.0])}, {"A": np.array([1.0, 8.0])})
    trace = [job("I0", 0, 1, 120.0), job("I1", 0, 1, 120.0)]
    config = SimConfig(placement="fft-pm", round_seconds=60, migration_seconds=0.0)
    result = simulate(trace, gpus, config)
    assert sorted(j.end / 60 for j in result.jobs) == pytest.approx([2.875, 3.75])
    assert sum(j.end for j in result.jobs) / 60 < 64 / 9


def test_fft_switching_penalty_hand_worked() -> None:
    # Table 1's instance with 5 s of migration (s = 1/12 round). t=0: I0 on GPU0, I1 on GPU1.
    # t=1: keep 17.07 vs swap 10.53 + 2/12 -> swap; each restores 5 s, so in round 2 I1 does
    #      55 s on GPU0 (57.5 left) and I0 55/8 on GPU1 (53.125 left).
    # t=2: I0 0.885 rounds left, I1 0.958: keep (I1 GPU0 3.045 + I0 GPU1 7.366 = 10.41, less
    #      rho_I0 theta = 0.123/8) beats swapping back (3.228 + 8.011, less 0.123): I1 ends at
    #      2 + 57.5/60 = 2.958 min; I0 does 7.5 s more on GPU1 (45.625 left).
    # t=3: I0 alone moves to GPU0: 5 s + 45.625 s -> 3.844 min.
    gpus = SimGpus(2, 1, {"A": np.array([1.0, 8.0])}, {"A": np.array([1.0, 8.0])})
    trace = [job("I0", 0, 1, 120.0), job("I1", 0, 1, 120.0)]
    config = SimConfig(placement="fft-pm", round_seconds=60, migration_seconds=5.0)
    result = simulate(trace, gpus, config)
    assert sorted(j.end / 60 for j in result.jobs) == pytest.approx(
        [2 + 57.5 / 60, 3 + 50.625 / 60]
    )
    assert sum(j.migrations for j in result.jobs) == 3


def test_fft_runs_jobs_larger_than_every_type_and_finishes_everything() -> None:
    values = np.array([1.0] * 4 + [1.3] * 4)
    gpus = SimGpus(2, 4, {"A": values, "D": values}, {"A": values, "D": values})
    trace = poisson_workload(30, 40.0, seed=3, classes=("A", "D"))
    trace.append(job("wide", 100.0, 8, 500.0))
    for name in ("fft-pm", "pal-fft"):
        result = simulate(trace, gpus, SimConfig(placement=name, round_seconds=300))
        assert result.summary()["unfinished"] == 0
        assert result.summary()["avg_ftf"] > 0


# --- SJF-BSBF share-or-wait --------------------------------------------------------------------


def test_share_or_wait_short_newcomer_shares() -> None:
    # R has 10 left, N needs 2, xi 1.5 each. Sequential: (10, 12), mean 11. Together N ends
    # first at 3; R did 2 of its 10 meanwhile, ends at 3 + 8 = 11: mean 7 < 11 -> share.
    decision = share_or_wait(10.0, 2.0, 1.5, 1.5)
    assert decision.sequential == (10.0, 12.0)
    assert decision.concurrent == pytest.approx((11.0, 3.0))
    assert decision.share and decision.t_share == pytest.approx(7.0)


def test_share_or_wait_long_newcomer_waits() -> None:
    # R 10 left, N 100, xi 2: sequential (10, 110) mean 60; together R ends at 20 and N has
    # 100 - 10 left: 110; mean 65 > 60 -> wait.
    decision = share_or_wait(10.0, 100.0, 2.0, 2.0)
    assert decision.concurrent == pytest.approx((20.0, 110.0))
    assert not decision.share and decision.t_share == pytest.approx(60.0)


def test_share_or_wait_case1_is_the_papers_eq21() -> None:
    # SJF-BSBF Eq. (21), case 1 (the running job B ends first): mean = t^_B i_B + t_A i_A / 2
    # - t^_B i_B / (2 xi_A), with t^ = t xi.
    rng = random.Random(1)
    for _ in range(50):
        left, new = rng.uniform(1, 10), rng.uniform(20, 50)
        xi_b, xi_a = rng.uniform(1, 3), rng.uniform(1, 3)
        decision = share_or_wait(left, new, xi_b, xi_a)
        expected = xi_b * left + new / 2 - xi_b * left / (2 * xi_a)
        assert sum(decision.concurrent) / 2 == pytest.approx(expected)


def test_interference_table_model_and_overrides() -> None:
    table = InterferenceTable(("A", "B", "C", "D"))
    assert table("A", "A") == pytest.approx(2.0)
    assert table("A", "D") == pytest.approx(1.25) == table("D", "A")
    assert table("D", "D") == pytest.approx(1.625)
    assert InterferenceTable(("A", "D"), xi=1.5)("A", "A") == 1.5
    assert InterferenceTable(("A", "D"), pairs={("A", "D"): 3.0})("A", "D") == 3.0
    with pytest.raises(ValueError, match="valid: A, D"):
        InterferenceTable(("A", "D"), pairs={("A", "Z"): 3.0})
    with pytest.raises(ValueError, match=">= 1.0"):
        InterferenceTable(("A",), xi=0.5)


# --- sharing in the engine ---------------------------------------------------------------------


def test_two_jobs_on_one_gpu_finish_when_the_interference_model_says() -> None:
    # One GPU. R (100 s) from 0; N (30 s) at 10 with xi = 2 for both. SJF-FFS shares at once:
    # both at half speed, N's 30 s take 60 s (ends 70), R did 30 of its 90 left meanwhile and
    # then runs alone: ends 70 + 60 = 130.
    gpus = uniform_gpus(["A"], 1, 1)
    trace = [job("R", 0, 1, 100.0), job("N", 10, 1, 30.0)]
    result = simulate(trace, gpus, SimConfig(placement="sjf-ffs", xi=2.0))
    assert ends(result) == pytest.approx({"R": 130.0, "N": 70.0})


def test_sharing_on_a_slow_gpu_multiplies_slowdown_and_interference() -> None:
    # Same pair on a GPU 1.5x slow (truth): N runs at 1 / (1.5 x 2): 30 s of work take 90 s
    # (ends 100); R had 100 - 10/1.5 left at 10, did 30 more, ends 100 + (100 - 6.67 - 30) x 1.5.
    gpus = SimGpus(1, 1, {"A": np.array([1.0])}, {"A": np.array([1.5])})
    trace = [job("R", 0, 1, 100.0), job("N", 10, 1, 30.0)]
    result = simulate(trace, gpus, SimConfig(placement="sjf-ffs", xi=2.0))
    assert ends(result)["N"] == pytest.approx(100.0)
    assert ends(result)["R"] == pytest.approx(100 + (100 - 10 / 1.5 - 30) * 1.5)


def test_sjf_bsbf_waits_where_sharing_does_not_pay_and_ffs_shares_anyway() -> None:
    # R (20 s) from 0; N (100 s) at 10, xi 2: share-or-wait says wait (R 10 left, N 100:
    # 60 < 65), so N starts at 20 and ends at 120. SJF-FFS shares: R ends 10 + 20 = 30,
    # N then has 100 - 10 left: 120.
    gpus = uniform_gpus(["A"], 1, 1)
    trace = [job("R", 0, 1, 20.0), job("N", 10, 1, 100.0)]
    bsbf = simulate(trace, gpus, SimConfig(placement="sjf-bsbf", xi=2.0))
    ffs = simulate(trace, gpus, SimConfig(placement="sjf-ffs", xi=2.0))
    assert ends(bsbf) == pytest.approx({"R": 20.0, "N": 120.0})
    assert ends(ffs) == pytest.approx({"R": 30.0, "N": 120.0})
    # A short newcomer shares under SJF-BSBF too: R 10 left, N 5, xi 1.5. Sequential (10, 15),
    # mean 12.5; together N ends after 7.5 (t = 17.5) while R does 5 of its 10, then R's last 5
    # alone (t = 22.5): mean 10 < 12.5 -> share.
    short = [job("R", 0, 1, 20.0), job("N", 10, 1, 5.0)]
    result = simulate(short, gpus, SimConfig(placement="sjf-bsbf", xi=1.5))
    assert ends(result) == pytest.approx({"R": 22.5, "N": 17.5})


def test_sjf_orders_by_work_and_never_shares() -> None:
    gpus = uniform_gpus(["A"], 1, 1)
    trace = [job("0", 0, 1, 50.0), job("long", 1, 1, 100.0), job("short", 2, 1, 10.0)]
    result = simulate(trace, gpus, SimConfig(placement="sjf"))
    assert ends(result) == pytest.approx({"0": 50.0, "short": 60.0, "long": 160.0})


def test_sharing_never_puts_three_jobs_on_a_gpu() -> None:
    gpus = uniform_gpus(["A", "D"], 2, 2)
    trace = poisson_workload(60, 60.0, seed=5, classes=("A", "D"))
    for name in ("sjf-ffs", "sjf-bsbf", "gimbal", "pal-share"):
        result = simulate(trace, gpus, SimConfig(placement=name))
        assert result.summary()["unfinished"] == 0
        assert max(busy for _, busy in result.timeline) <= 4


# --- GIMBAL-style --------------------------------------------------------------------------------


def test_gimbal_smaller_joins_larger_never_the_reverse() -> None:
    # 1 node x 2 GPUs; classes A (compute) and D (memory) pair well (xi 1.25).
    gpus = uniform_gpus(["A", "D"], 1, 2)
    small_joins = [job("big", 0, 2, 1000.0, "A"), job("small", 10, 1, 50.0, "D")]
    result = simulate(small_joins, gpus, SimConfig(placement="gimbal"))
    assert next(j for j in result.jobs if j.job_id == "small").start == 10.0
    big_waits = [
        job("small", 0, 1, 1000.0, "A"),
        job("other", 0, 1, 1000.0, "A"),
        job("big", 10, 2, 50.0, "D"),
    ]
    result = simulate(big_waits, gpus, SimConfig(placement="gimbal"))
    assert next(j for j in result.jobs if j.job_id == "big").start == pytest.approx(1000.0)


def test_static_squeeze_picks_the_best_mps_share() -> None:
    # squeezed job (compute-bound, xi 2 under free competition) vs the other (xi 2): at share x
    # the squeezed runs max(2, 1/x) slower, the other 1 + x slower. Brute force over the grid.
    x, xs, xo, mean = squeeze(100.0, 100.0, 2.0, 2.0)
    means = {}
    for k in range(1, 11):
        share = k / 10
        d = share_or_wait(100.0, 100.0, 1 + share, max(2.0, 1 / share))
        means[share] = sum(d.concurrent) / 2
    assert mean == pytest.approx(min(means.values()))
    assert means[x] == pytest.approx(mean) and xs == max(2.0, 1 / x) and xo == 1 + x


# --- fairness and CLI ----------------------------------------------------------------------------


def test_finish_time_fairness_hand_example() -> None:
    # One GPU; two 100 s jobs from 0, run one after the other. Job 0 ends at 100 with 2 jobs
    # in the system throughout: T_id = 100 x 2 -> FTF 0.5. Job 1 ends at 200 with on average
    # (2 x 100 + 1 x 100) / 200 = 1.5 jobs: T_id = 150 -> FTF 4/3.
    outcomes = [
        JobOutcome("0", "A", 1, 0.0, 0.0, 100.0, 100.0, True, 0, 0),
        JobOutcome("1", "A", 1, 0.0, 100.0, 200.0, 100.0, True, 0, 0),
    ]
    assert finish_time_fairness(outcomes, 1) == pytest.approx({"0": 0.5, "1": 4 / 3})
    # a 2-GPU job alone on 4 GPUs cannot run faster than its work: FTF 1
    alone = [JobOutcome("0", "A", 2, 0.0, 0.0, 50.0, 50.0, True, 0, 0)]
    assert finish_time_fairness(alone, 4) == {"0": pytest.approx(1.0)}


def test_every_policy_reports_fairness() -> None:
    gpus = uniform_gpus(["A", "D"], 2, 2)
    trace = poisson_workload(20, 30.0, seed=2, classes=("A", "D"))
    for name in ALL_PLACEMENTS:
        summary = simulate(trace, gpus, SimConfig(placement=name)).summary()
        assert summary["avg_ftf"] > 0 and summary["max_ftf"] >= summary["avg_ftf"]


TRACE = """job_id,num_gpus,submit_time,duration,model
0,1,0,1000,vgg19
1,4,10,2000,resnet50
2,2,30,3000,PointNet
3,1,400,100,GPT2
"""


def test_cli_accepts_the_peers_and_lists_valid_names(
    run_cli: Callable[..., object], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    names = ",".join(PEERS)
    result = run_cli(
        "sim", "run", "--trace", trace, "--cluster", "2x4", "--placement", names, "--json"
    )
    rows = json.loads(result.output)
    assert [r["placement"] for r in rows] == list(PEERS)
    assert all(r["unfinished"] == 0 and r["avg_ftf"] > 0 for r in rows)
    bad = run_cli("sim", "run", "--trace", trace, "--placement", "sjf-bsfb", ok=False)
    assert bad.exit_code != 0
    assert "sjf-bsbf" in bad.output and "fft-pm" in bad.output and "gimbal" in bad.output


class _PinnedPolicy:
    """Starts each job on GPUs fixed in advance (to test the engine, not a policy)."""

    name = "pinned"
    scheduler = "fifo"

    def __init__(self, combine: str, gpus: dict[str, tuple[int, ...]], xi: float) -> None:
        self.combine = combine
        self.gpus = gpus
        self.xi = xi

    def schedule(self, run, pending, now) -> None:
        for job in pending:
            run.start(job, self.gpus[job.spec.job_id], now, lambda a, b: (self.xi, self.xi))


@pytest.mark.parametrize(("combine", "host_end"), [("max", 200.0 + 50.0), ("liss", None)])
def test_a_partly_shared_host_runs_at_its_slowest_worker_or_at_the_mean_with_liss(
    combine: str, host_end: float | None
) -> None:
    # Host H (2 GPUs, 200 s) from 0; guest G (1 GPU, 50 s) joins GPU 0 at 0, xi 2.
    # max: H runs at 1/2 while G is there; G's 50 s take 100 s; H did 50, then 150 alone: 250.
    # liss: H runs at the mean of its workers' speeds (1/2 and 1): xi_eff = 2 / (1/2 + 1) = 4/3;
    #       after 100 s H did 75, then 125 alone: 225.
    from slurm_pal.sim.peers.sharing import SharingRun

    gpus = uniform_gpus(["A"], 1, 2)
    trace = [job("H", 0, 2, 200.0), job("G", 0, 1, 50.0)]
    policy = _PinnedPolicy(combine, {"H": (0, 1), "G": (0,)}, 2.0)
    result = SharingRun(trace, gpus, policy, locality_penalty=1.7).run()
    expected = host_end if host_end is not None else 100.0 + (200.0 - 100.0 * 3 / 4)
    assert ends(result) == pytest.approx({"H": expected, "G": 100.0})


def test_pm_aware_sharing_puts_memory_bound_jobs_on_gpus_slow_for_compute() -> None:
    # 1 node x 2 GPUs; GPU 1 is slow for class A (compute-bound), both alike for D. Two A jobs
    # hold both GPUs; a D job arrives: it may share, and picks the A job on the slow GPU.
    # A third job, class A, finds no free GPU and may not share: it waits.
    scores = {"A": np.array([1.0, 1.4]), "D": np.array([1.0, 1.0])}
    gpus = SimGpus(1, 2, scores, scores)
    trace = [
        job("fast", 0, 1, 1000.0, "A"),
        job("slow", 0, 1, 1000.0, "A"),
        job("mem", 10, 1, 50.0, "D"),
        job("compute", 20, 1, 50.0, "A"),
    ]
    result = simulate(trace, gpus, SimConfig(placement="pal-share"))
    by_id = {j.job_id: j for j in result.jobs}
    assert by_id["mem"].start == 10.0
    assert by_id["compute"].start == pytest.approx(by_id["fast"].end)
    # mem shared GPU 1 (slow for A) with "slow": both at xi 1.25 (A with D). mem's 50 s take
    # 62.5 s (ends 72.5); "slow" (1.4x alone) lost 62.5 x (1 - 1/1.25) = 12.5 s: ends 1412.5,
    # while "fast" on GPU 0 was never touched: 1000.
    assert by_id["fast"].end == pytest.approx(1000.0)
    assert by_id["mem"].end == pytest.approx(72.5)
    assert by_id["slow"].end == pytest.approx(1412.5)
