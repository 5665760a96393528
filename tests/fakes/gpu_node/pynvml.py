"""A GPU node's ``pynvml`` for running scripts/gpu_check.sh without a GPU (tests only).

Put this folder first on PYTHONPATH: it loads the real nvidia-ml-py under its own name (its
constants, structs and errors), builds the fake of ``fake_pynvml`` around one GPU that reads
like a power-capped GEMM, and answers every call through it. Only the driver calls are faked.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_me = sys.modules[__name__]
_search = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("pynvml", _search)
assert _spec is not None and _spec.loader is not None, "nvidia-ml-py is not installed"
_real = importlib.util.module_from_spec(_spec)
sys.modules["pynvml"] = _real  # fake_pynvml imports the real module by this name
_spec.loader.exec_module(_real)
sys.path.insert(0, str(_HERE.parent))
import fake_pynvml as _fake_module  # noqa: E402

sys.modules["pynvml"] = _me


class _NodeNvml(_fake_module.FakePynvml):
    """The calls a node's tools make beyond the sampler's."""

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetMinorNumber(self, handle):
        return self._gpu(handle).index

    def nvmlDeviceGetName(self, handle) -> str:
        return "Fake GPU"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "0.0"

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return 690_000

    def nvmlDeviceGetTemperature(self, handle, sensor) -> int:
        return 58


_fake = _NodeNvml(
    [
        _fake_module.FakeGpu(
            index=0,
            uuid="GPU-00000000-0000-0000-0000-0000000000f0",
            gpm_intervals=[
                {
                    "NVML_GPM_METRIC_DRAM_BW_UTIL": 16.8,
                    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 93.6,
                    "NVML_GPM_METRIC_INTEGER_UTIL": 1.4,
                    "NVML_GPM_METRIC_GRAPHICS_UTIL": 99.9,
                }
            ],
            utilization=[(100, 17)],
            clock_reasons=[0x4],
            sm_clocks=[1420],
            max_sm_clock=1980,
        )
    ]
)


def __getattr__(name: str):
    try:
        return getattr(_fake, name)
    except AttributeError:
        return getattr(_real, name)
