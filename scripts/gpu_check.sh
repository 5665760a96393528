#!/usr/bin/env bash
# What the project runs on a GPU node, run on one GPU without Slurm, in one go (on an H200: 405 s
# for steps 1-3, 190 s more for step 4):
#   1. the campaign runner over gemm.py/stream.py at the default window (warm-up 10 s, measure
#      20 s), 3 repeats each, and again as 0.3 s runs; `campaign collect` of both;
#   2. the Prolog/Epilog hooks around each benchmark (the detached NVML sampler, busy-time
#      figures), `apps classify` / `apps fit -k 2` on their records, Nsight Compute on the same
#      benchmarks if `ncu` is there;
#   3. per-second GPM readings (GRAPHICS/SM/INTEGER utilization, SM clock) idle, under STREAM
#      and under GEMM;
#   4. the benchmarks' CuPy path (PyTorch hidden), beside the PyTorch runs of step 1;
#   and the NVML health readings the signal reader uses (scripts/nvml_health.py), idle and busy.
# Usage, from the repository root: scripts/gpu_check.sh OUTDIR (GPU 0 is measured).
# Every step runs even when one before it failed; OUTDIR/steps.log says which failed.
# GPU_CHECK_STEPS="versions cupy" runs only the steps named (default: all).
# GPU_CHECK_GEMM / GPU_CHECK_STREAM replace the benchmark commands (a stand-in for a dry run).
set -u
OUT_DIR=$(mkdir -p "$1" && cd "$1" && pwd)
ROOT=$(pwd)
PY=${PYTHON:-python3}
GEMM=${GPU_CHECK_GEMM:-"$PY $ROOT/profiling/gemm.py"}
STREAM=${GPU_CHECK_STREAM:-"$PY $ROOT/profiling/stream.py"}
# the campaign runs the plan's own default benchmarks unless a stand-in is given
PLAN_COMMANDS=()
[ -n "${GPU_CHECK_GEMM:-}" ] && PLAN_COMMANDS+=(--command "A=$GEMM")
[ -n "${GPU_CHECK_STREAM:-}" ] && PLAN_COMMANDS+=(--command "C=$STREAM")
W=$(mktemp -d /tmp/gpu-check.XXXXXX)
cleanup() { # also when stopped: no sampler left running, no scratch left behind
    local pid
    for f in "$W"/spool/telemetry/*.pid; do
        [ -e "$f" ] && pid=$(cat "$f") && kill "$pid" 2>/dev/null
    done
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export SLURM_PAL_DB="$W/store.db" SLURM_PAL_CAMPAIGNS="$W/campaigns"
export PYTHONUNBUFFERED=1
CLI=("$PY" -m slurm_pal.cli.main)
LOG="$OUT_DIR/steps.log"
: >"$LOG"

step() { # step NAME CMD...: run, time, log the outcome, never stop the script
    local name=$1 t0 rc
    shift
    case " ${GPU_CHECK_STEPS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    t0=$(date +%s)
    echo "== $name: $*" | tee -a "$LOG"
    "$@"
    rc=$?
    echo "== $name: rc=$rc in $(($(date +%s) - t0)) s" | tee -a "$LOG"
    # after every step, so a run stopped at its time limit still brings back what it did
    tar -C "$W" -czf "$OUT_DIR/gpu-check.tar.gz" --exclude store.db --exclude campaigns .
}

versions() {
    nvidia-smi --query-gpu=name,uuid,driver_version,vbios_version,power.limit,clocks.max.sm,memory.total \
        --format=csv
    nvidia-smi -q | sed -n '/CUDA Version/p;/Product Name/p;/Persistence Mode/p'
    "$PY" -c 'import sys, platform; print("python", sys.version.split()[0], platform.machine())'
    "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    "$PY" -c 'import cupy; print("cupy", cupy.__version__)'
    "$PY" -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'
    "$PY" -c 'import ClusterShell; print("ClusterShell", ClusterShell.__version__)' ||
        echo "ClusterShell missing: install the project's dependencies (apps and campaign steps need it)"
    "$PY" -m pip show nvidia-ml-py 2>/dev/null | sed -n 's/^Version: /nvidia-ml-py /p'
    command -v ncu && ncu --version | tail -1
    uname -r
}

campaign() { # campaign ID WARMUP MEASURE: plan + run the runner on "g1" GPU 0 + collect
    local id=$1 warm=$2 measure=$3
    "${CLI[@]}" campaign plan --nodes g1 --gpus-per-node 1 --repeats 3 --classes A,C \
        "${PLAN_COMMANDS[@]}" --gpu-model h-check \
        --warmup-s "$warm" --measure-s "$measure" --python "$PY" --id "$id" --json \
        >"$W/$id.plan.json" || return 1
    SLURMD_NODENAME=g1 SLURM_JOB_GPUS=0 SLURM_JOB_ID=1 \
        "$PY" "$SLURM_PAL_CAMPAIGNS/$id/runner.py" \
        --plan "$SLURM_PAL_CAMPAIGNS/$id/campaign.json" --node g1 --gpu 0
    "${CLI[@]}" campaign collect "$id" --json >"$W/$id.collect.json"
    local rc=$?
    cat "$W/$id.collect.json"
    mkdir -p "$W/records/$id" && cp "$SLURM_PAL_CAMPAIGNS/$id/results/"*.json "$W/records/$id/"
    return $rc
}

labels() { # labels.json as `site render` writes it: Slurm index 0 -> device 0 -> its UUID
    local uuid
    uuid=$("$PY" -c 'import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)))')
    printf '{"campaign": "c", "nodes": {"g1": [{"index": 0, "slurm_index": 0, "label": "h-a0", "uuid": "%s", "file": "/dev/nvidia0"}]}}\n' \
        "$uuid" >"$W/labels.json"
}

hooked() { # hooked JOBID CMD...: Prolog (starts the sampler), the job, Epilog (its record)
    local job=$1
    shift
    local env=(SLURM_JOB_ID="$job" SLURMD_NODENAME=g1 SLURM_JOB_GPUS=0 SLURM_JOB_USER=check
        SLURM_JOB_UID=0 SLURM_JOB_PARTITION=gpu)
    local hook=("$PY" -m slurm_pal.hooks)
    env "${env[@]}" "${hook[@]}" prolog --spool-dir "$W/spool" --labels "$W/labels.json" \
        --sample-s 1 --socket "$W/no-advisor.sock"
    "$@" >"$W/job$job.out" 2>&1
    local rc=$?
    tail -5 "$W/job$job.out"
    env "${env[@]}" SLURM_JOB_EXIT_CODE2="$rc:0" "${hook[@]}" epilog --spool-dir "$W/spool" \
        --labels "$W/labels.json" --socket "$W/no-advisor.sock"
    return $rc
}

classify() {
    local epilog
    for pair in gemm:101 stream:102 gemm-fp32:104 idle:103; do
        epilog="$W/spool/${pair#*:}.g1.epilog.json"
        [ -e "$epilog" ] || { echo "no epilog record for ${pair%%:*}"; continue; }
        "${CLI[@]}" apps classify "$epilog" --app "${pair%%:*}" --json
    done
    "${CLI[@]}" apps fit -k 2 --json
    "${CLI[@]}" apps list
}

ncu_runs() {
    command -v ncu >/dev/null || { echo "ncu: not installed"; return 0; }
    local metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active
    mkdir -p "$W/ncu"
    for b in gemm stream; do
        local cmd=$GEMM
        [ $b = stream ] && cmd=$STREAM
        # shellcheck disable=SC2086
        timeout 100 ncu --csv --target-processes all --clock-control none --metrics "$metrics" \
            $cmd --warmup-s 0 --iters 5 >"$W/ncu/ncu-$b.details.csv" 2>"$W/ncu/ncu-$b.err"
        echo "ncu $b: rc=$? $(wc -l <"$W/ncu/ncu-$b.details.csv") lines"
        "${CLI[@]}" apps classify "$W/ncu/ncu-$b.details.csv" --app "ncu-$b" --json
    done
}

cupy_runs() { # each benchmark through CuPy: 3 runs at the default window with PyTorch hidden
    local hide='import os, runpy, sys; sys.modules["torch"] = None; sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); runpy.run_path(sys.argv[0], run_name="__main__")'
    mkdir -p "$W/cupy"
    for b in gemm stream; do
        for r in 0 1 2; do
            "$PY" -c "$hide" "$ROOT/profiling/$b.py" >"$W/cupy/$b-r$r.out" 2>&1
            echo "cupy $b r$r: rc=$? $(grep PAL_DURATION_S "$W/cupy/$b-r$r.out")"
        done
    done
}

health() { # NVML's health readings, idle and (GPU_CHECK_BUSY_S, default 10) under a matmul
    "$PY" "$ROOT/scripts/nvml_health.py" --busy-s "${GPU_CHECK_BUSY_S:-10}" >"$W/nvml-health.json"
    local rc=$?
    cat "$W/nvml-health.json"
    return "$rc"
}

probe() { # probe LABEL CMD...: per-second GPM readings, 5 s idle, the command, 2 s after
    local label=$1
    shift
    mkdir -p "$W/gpm"
    "$PY" "$ROOT/scripts/gpm_probe.py" --idle-s 5 --label "$label" -- "$@" >"$W/gpm/gpm-$label.json"
}

# shellcheck disable=SC2086
{
    step versions versions
    step campaign-window campaign check-window 10 20
    step campaign-short campaign check-short 0 0.3
    step labels labels
    step hook-gemm hooked 101 $GEMM --warmup-s 3 --measure-s 10
    step hook-stream hooked 102 $STREAM --warmup-s 3 --measure-s 10
    step hook-idle hooked 103 sleep 8
    step hook-gemm-fp32 hooked 104 $GEMM --dtype fp32 --warmup-s 3 --measure-s 10
    step classify classify
    step probe-stream probe stream $STREAM --warmup-s 2 --measure-s 10
    step probe-gemm probe gemm $GEMM --warmup-s 2 --measure-s 8
    step health health
    step ncu ncu_runs
    step cupy cupy_runs
} 2>&1 | tee "$OUT_DIR/gpu-check.log"
echo "done: $OUT_DIR"
