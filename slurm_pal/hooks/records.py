"""Job records from the Prolog/Epilog environment (pure: an environment mapping in, a dict out).

Why separate: the fields and their sources are the contract with the advisor (PROTOCOL.md, op
``record``), and what Slurm puts in the hook environment is subtle (22.05: no SLURM_JOB_NAME in
the Prolog, ``SLURM_JOB_EXIT_CODE2`` is ``exit:signal``), so it is tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_pal.errors import SlurmPalError

KINDS = ("prolog", "epilog")


class HookEnvError(SlurmPalError, ValueError):
    """The environment is not a Slurm Prolog/Epilog's (no job id); says which variable."""


def parse_gpus(text: str | None) -> list[int]:
    """``SLURM_JOB_GPUS`` ("0,2") -> [0, 2]; entries that are not numbers are skipped."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if item.isdigit():
            out.append(int(item))
    return out


def job_id_of(env: Mapping[str, str]) -> int:
    raw = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not raw.strip().isdigit():
        raise HookEnvError(f"SLURM_JOB_ID is {raw!r}; a Prolog/Epilog always has a numeric job id")
    return int(raw)


def record_id(job_id: int, node: str, kind: str) -> str:
    return f"{job_id}:{node}:{kind}"


def build_record(kind: str, env: Mapping[str, str], node: str, now: float) -> dict[str, object]:
    """The record of one hook run on ``node`` (fields that Slurm did not give are left out)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    job_id = job_id_of(env)
    record: dict[str, object] = {
        "record_id": record_id(job_id, node, kind),
        "kind": kind,
        "job_id": job_id,
        "node": node,
        "time": round(now, 3),
        "slurm_gpus": parse_gpus(env.get("SLURM_JOB_GPUS")),
    }
    if kind == "prolog":
        for key, var in (
            ("user", "SLURM_JOB_USER"),
            ("name", "SLURM_JOB_NAME"),
            ("partition", "SLURM_JOB_PARTITION"),
            ("constraints", "SLURM_JOB_CONSTRAINTS"),
            ("comment", "SLURM_JOB_COMMENT"),
        ):
            if env.get(var):
                record[key] = env[var]
        uid = env.get("SLURM_JOB_UID", "")
        if uid.isdigit():
            record["uid"] = int(uid)
    else:
        code = exit_code(env)
        if code is not None:
            record["exit_code"] = code
    return record


def exit_code(env: Mapping[str, str]) -> int | None:
    """The job's exit code: ``SLURM_JOB_EXIT_CODE2`` is ``exit:signal``; the older
    ``SLURM_JOB_EXIT_CODE`` is a wait status (exit code << 8)."""
    text = env.get("SLURM_JOB_EXIT_CODE2", "")
    head = text.split(":", 1)[0]
    if head.isdigit():
        return int(head)
    raw = env.get("SLURM_JOB_EXIT_CODE", "")
    if raw.isdigit():
        return int(raw) >> 8
    return None


def spool_name(record: Mapping[str, object]) -> str:
    """``<job>.<node>.<kind>.json`` (PROTOCOL.md "Spool dir")."""
    node = str(record["node"]).replace("/", "_")
    return f"{record['job_id']}.{node}.{record['kind']}.json"
