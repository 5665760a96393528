"""The service's heap between Slurm reads (advisor/heap.py): frozen, so a collection walks only
what the last read made, yet nothing is kept for ever."""

from __future__ import annotations

import gc
import weakref

from slurm_pal.advisor.heap import FrozenHeap


class Node:
    """A container the collector tracks (and can put in a cycle)."""

    other: object = None


def test_frozen_objects_are_skipped_until_the_next_full_pass_then_collected() -> None:
    now = [0.0]
    heap = FrozenHeap(full_every_s=60.0, clock=lambda: now[0])
    looped = Node()
    looped.other = looped  # only the cyclic collector can free it
    plain = Node()
    looped_ref, plain_ref = weakref.ref(looped), weakref.ref(plain)
    try:
        heap.after_read()
        assert gc.get_freeze_count() > 0
        del looped, plain
        gc.collect()
        assert plain_ref() is None  # reference counting frees as always
        assert looped_ref() is not None  # frozen: no collection walks it
        now[0] = 30.0
        heap.after_read()
        gc.collect()
        assert looped_ref() is not None
        now[0] = 61.0
        heap.after_read()  # the full pass is due: unfrozen, collected, frozen again
        assert looped_ref() is None
    finally:
        heap.release()
    assert gc.get_freeze_count() == 0
