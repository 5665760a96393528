"""Stands in for gemm.py / stream.py where there is no GPU: the benchmark contract's lines
(PAL_MEASURE_START, PAL_DURATION_S) after a short sleep, whatever window it is given."""

import argparse
import time

parser = argparse.ArgumentParser()
parser.add_argument("--warmup-s", type=float, default=10.0)
parser.add_argument("--measure-s", type=float, default=20.0)
parser.add_argument("--iters", type=int)
parser.add_argument("--dtype")
parser.add_argument("--elements")
parser.add_argument("--size")
args = parser.parse_args()
time.sleep(min(args.warmup_s, 0.2))
print("PAL_MEASURE_START", flush=True)
time.sleep(min(args.measure_s, 0.5))
print("PAL_DURATION_S=0.00171")
