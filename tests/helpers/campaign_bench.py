"""The fake benchmark campaign tests run instead of a GPU one: a shell script that prints
``PAL_DURATION_S`` (or fails) as a per-GPU, per-class table written by the test says."""

from __future__ import annotations

from pathlib import Path

FAKE_BENCH = """#!/bin/sh
# Fake benchmark: runs the snippet for this GPU and class from $FAKE_BENCH_DIR.
d="$FAKE_BENCH_DIR"
f="$d/$PAL_NODE-$PAL_GPU_INDEX-$PAL_CLASS"
[ -f "$f" ] || f="$d/default-$PAL_CLASS"
[ -f "$f" ] || f="$d/default"
. "$f"
"""


def write_bench_table(folder: Path, table: dict[str, object]) -> None:
    """Snippets per ``NODE-GPU-CLASS`` / ``default-CLASS`` / ``default`` key.

    A list gives the duration of each repeat, an int makes the run fail with that exit code
    (and an Xid line on stderr), a str is printed as the benchmark's stdout.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    for key, value in table.items():
        if isinstance(value, int):
            body = f'echo "CUDA error: Xid 79 on $PAL_NODE" >&2\nexit {value}\n'
        elif isinstance(value, str):
            body = f"cat <<'EOF'\n{value}EOF\n"
        else:
            cases = "".join(f"{i}) d={v};; " for i, v in enumerate(value))  # type: ignore[arg-type]
            body = f'echo "log line"\ncase "$PAL_REPEAT" in {cases}esac\necho "PAL_DURATION_S=$d"\n'
        (folder / key).write_text(body)
