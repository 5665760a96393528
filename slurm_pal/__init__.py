"""slurm-pal: PM-First / PAL GPU placement advisor for Slurm."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``__version__``: the installed version (pyproject.toml's, as pip installed it), which the
    advisor writes into each job's admin comment and ``/metrics`` so a job tells which build
    routed it. Read on first use: the Prolog/Epilog import this package, never need the
    version, and reading the installed metadata would cost each of them about 0.1 s."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("slurm-pal")
    except PackageNotFoundError:  # a source tree put on sys.path, never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
