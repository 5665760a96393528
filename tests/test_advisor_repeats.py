"""A repeat of a request decided on the same state gets that decision again (advisor/repeats.py):
the answers must be the ones deciding each request anew gives, each a decision of its own.

Slurm is fed through ``CliStateReader`` from the captured 22.05 samples (tests/helpers/advisor).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_pal.adapters.store import Store
from slurm_pal.advisor.repeats import REPEAT_S, RepeatAnswers, request_key
from slurm_pal.advisor.state import AdvisorState
from slurm_pal.engine.decide import Decision, parse_admin_comment
from tests.helpers.advisor import JOB, Env, short_env


@pytest.fixture
def env() -> Iterator[Env]:
    with short_env("spal-rep-", policy="packed-pm") as the_env:
        yield the_env


TWO_A = dict(JOB)  # 2 GPUs, class A (resnet)
ONE_D = {**JOB, "name": "rank", "comment": "pal:app=pagerank", "tres_per_node": "gres:gpu:1"}
ONE_D["script"] = "#!/bin/sh\n#PAL app=pagerank\nsleep 1\n"
FOUR_A = {**JOB, "name": "big", "tres_per_node": "gres:gpu:4"}


def _ask(st: AdvisorState, wire: dict[str, object]) -> tuple[Decision, bool]:
    """One request as the server asks: the answer, then the work queued after it."""
    after: list = []
    _, decision, repeat = st.decide_wire(dict(wire), after)
    for task in after:
        task()
    return decision, repeat


def _seen(decision: Decision) -> tuple[object, ...]:
    """What Slurm and the store get of a decision, its token written as T."""
    fields = dict(decision.set_fields)
    if decision.token is not None and "admin_comment" in fields:
        comment = str(fields["admin_comment"])
        assert f" r={decision.token} " in comment
        fields["admin_comment"] = comment.replace(decision.token, "T")
    uuids = None if decision.allocation is None else tuple(decision.allocation.uuids)
    return (decision.action, fields, decision.reason, uuids, decision.wait_until)


def test_repeats_get_the_decisions_deciding_each_anew_gives(env: Env) -> None:
    env.clock.now = 1_000.0
    kept = env.state(wall_clock=env.clock)
    anew = env.state(wall_clock=env.clock, repeat_s=0)
    steps: list[dict[str, object] | str] = [TWO_A, TWO_A, TWO_A, ONE_D, ONE_D, TWO_A, TWO_A]
    steps += ["refresh", TWO_A, FOUR_A, FOUR_A, "later", FOUR_A, TWO_A, TWO_A, TWO_A, ONE_D]
    steps += [TWO_A, ONE_D, TWO_A, "refresh", TWO_A, TWO_A]
    repeats, tokens, actions = 0, set(), []
    for step in steps:
        if step == "refresh":  # Slurm's read: nothing ran, the reservations stay
            kept.refresh()
            anew.refresh()
            continue
        env.clock.now += 2 * REPEAT_S if step == "later" else 0.05
        if step == "later":
            continue
        assert isinstance(step, dict)
        got, repeat = _ask(kept, step)
        want, never = _ask(anew, step)
        assert not never
        assert _seen(got) == _seen(want)
        repeats += repeat
        tokens.add(got.token)
        actions.append((got.action, repeat))
    # passes were given again; a route takes GPUs, so the next is always decided anew
    assert {action for action, repeat in actions if repeat} == {"pass"}
    assert repeats >= 4
    assert len(tokens) == len([s for s in steps if isinstance(s, dict)])


def test_a_repeated_pass_is_a_decision_of_its_own(env: Env) -> None:
    st = env.state()
    while _ask(st, FOUR_A)[0].action == "route":
        pass
    first, was = _ask(st, ONE_D)
    second, repeat = _ask(st, ONE_D)
    assert (first.action, second.action, was, repeat) == ("pass", "pass", False, True)
    assert first.token != second.token
    for decision in (first, second):
        parsed = parse_admin_comment(str(decision.set_fields["admin_comment"]))
        assert parsed is not None and parsed["r"] == decision.token
    st.writer.call(lambda s: None)
    with Store(env.db) as store:
        rows = [store.decision(d.token) for d in (first, second)]  # type: ignore[arg-type]
    assert [r["state"] for r in rows] == ["waiting", "waiting"]  # type: ignore[index]


def test_a_new_read_or_a_second_passing_makes_the_kept_answer_stale(env: Env) -> None:
    st = env.state()
    while _ask(st, FOUR_A)[0].action == "route":
        pass
    assert _ask(st, ONE_D)[1] is False
    assert _ask(st, ONE_D)[1] is True
    st.refresh()
    assert _ask(st, ONE_D)[1] is False
    env.clock.now += REPEAT_S + 0.1
    assert _ask(st, ONE_D)[1] is False
    assert _ask(st, ONE_D)[1] is True
    st.release_reservation(next(iter(st.reservations())))  # GPUs free again
    again, repeat = _ask(st, ONE_D)
    assert again.allocation is not None and not repeat  # placed, not the kept wait


def test_request_keys() -> None:
    assert request_key({"a": 1, "b": "x"}) == request_key({"b": "x", "a": 1})
    assert request_key({"a": 1}) != request_key({"a": 2})
    assert request_key({"a": 1, "modify": True, "job_id": 5}) is None
    assert request_key({"a": [1]}) is None  # not a plain value: never kept


def test_kept_answers_go_when_their_inputs_are_gone() -> None:
    book, advice = RepeatAnswers(size=2), object()
    a, b = object(), object()
    book.keep("k1", (a,), 0.0, advice)  # type: ignore[arg-type]
    book.keep("k2", (a,), 0.0, advice)  # type: ignore[arg-type]
    book.keep("k3", (a,), 0.0, advice)  # type: ignore[arg-type]
    assert book.take("k1", (a,), 0.0) is None  # the oldest went for room
    assert book.take("k2", (a,), 0.5) is not None
    book.keep("k4", (b,), 0.0, advice)  # type: ignore[arg-type]
    assert book.take("k3", (b,), 0.0) is None and book.take("k4", (b,), 0.0) is not None
    assert RepeatAnswers(repeat_s=0).take("k", (a,), 0.0) is None
