"""Slurm hostlist expressions (ClusterShell's NodeSet kept to Slurm's syntax): expansion rules,
errors, and compress/expand round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_pal.core import hostlist
from slurm_pal.core.hostlist import compress, expand


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("gpu-[1-2]-[1-2]", ["gpu-1-1", "gpu-1-2", "gpu-2-1", "gpu-2-2"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("rack[1-2]n[3,5]x", ["rack1n3x", "rack1n5x", "rack2n3x", "rack2n5x"]),
        ("n[1-2],n[2-3]", ["n1", "n2", "n3"]),
        (" n1 , n2 ", ["n1", "n2"]),
        ("n2 n1\tn3", ["n1", "n2", "n3"]),  # whitespace separates, as in Slurm
        ("n[3,1]", ["n1", "n3"]),  # sorted, duplicates dropped: a set of nodes
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("", []),
    ],
)
def test_expand_follows_slurm_rules(expression: str, names: list[str]) -> None:
    assert expand(expression) == names


@pytest.mark.parametrize(
    "expression",
    [
        "node[1-2",
        "node1-2]",
        "node[[1-2]]",
        "node[3-1]",
        "node[a-b]",
        "node[1-]",
        # NodeSet's own syntax that Slurm does not have: refused, never resolved
        "n[1-4]!n2",
        "n1&n2",
        "n1^n2",
        "@compute",
        "n[1-2]@x",
        "n[1-4/2]",
    ],
)
def test_expand_rejects_malformed_expressions(expression: str) -> None:
    with pytest.raises(ValueError):
        expand(expression)


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["node01", "node02", "node03", "node04", "node07"], "node[01-04,07]"),
        (["node8", "node9", "node10"], "node[8-10]"),
        (["node07"], "node07"),
        (["n2", "n2"], "n2"),
        (["gpu-1-1", "gpu-1-2", "gpu-2-1"], "gpu-1-[1-2],gpu-2-1"),
        (["login", "n2", "n1"], "login,n[1-2]"),
        (["rack1-n01", "rack2-n01", "rack1-n02"], "rack1-n[01-02],rack2-n01"),
        ([f"gpu{i:04d}" for i in range(4096)], "gpu[0000-4095]"),
    ],
)
def test_compress_prints_what_slurm_prints(names: list[str], expression: str) -> None:
    assert compress(names) == expression


@pytest.mark.parametrize("name", ["node[1]", "a,b", "a b", "", "n!1", "@g"])
def test_compress_rejects_names_that_cannot_be_expressed(name: str) -> None:
    for names in (["n1", name], [name], [name]):  # alone too, and again (answers are cached)
        with pytest.raises(ValueError, match="cannot compress"):
            compress(names)


def test_a_huge_expression_is_refused_without_building_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo or a hostile --nodelist must not make the advisor build millions of names."""
    with pytest.raises(ValueError, match="more than"):
        expand("n[1-99999999]")
    monkeypatch.setattr(hostlist, "MAX_NAMES", 10)
    assert len(expand("n[1-10]")) == 10
    with pytest.raises(ValueError, match="more than 10"):
        expand("n[1-5],m[1-6]")


_node_names = st.builds(
    lambda prefix, number, width, suffix: f"{prefix}{number:0{width}d}{suffix}",
    st.sampled_from(["n", "node", "gpu-1-", "x"]),
    st.integers(min_value=0, max_value=120),
    st.integers(min_value=1, max_value=4),
    st.sampled_from(["", "a"]),
) | st.sampled_from(["login", "head"])


@settings(max_examples=200, deadline=None)
@given(st.lists(_node_names, max_size=25))
def test_compress_then_expand_gives_back_the_same_names(names: list[str]) -> None:
    assert sorted(expand(compress(names))) == sorted(set(names))
