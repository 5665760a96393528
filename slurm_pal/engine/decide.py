"""The submit-time decision: route a GPU job to the GPUs PM-First/PAL picks, or pass it (pure).

Why pure: it runs for every GPU job while slurmctld holds its job-write lock, and the re-planner
and the tests call it on their own cluster views; I/O (the socket, Slurm, the store) stays in
``server``/``state``. ``decide`` never raises on anything a user can write: a request it cannot
read, model or satisfy now is *passed* (accepted as written) with the reason.

Routing encodings (PROTOCOL.md "Routing encodings"; Slurm findings in testbed/NOTES.md):

1. one node: ``req_nodes=NODE``, ``tres_per_node=gres:gpu:L1:a,gres:gpu:L2:b`` (the chosen GPUs'
   labels, counted), ``min_nodes=max_nodes=1``;
2. several nodes with the same label multiset: the same per-node typed request on all of them;
3. several nodes, different multisets but equal counts: untyped ``tres_per_node=gres:gpu:g``
   (the node choice is kept, the GPU choice within a node is Slurm's);
4. otherwise ``tres_per_job=gres:gpu:N`` on the chosen nodes (Slurm splits the count), typed
   ``gres:gpu:L:N`` when all chosen GPUs share one label ``L``;

and jobs asking GPUs per task get only ``req_nodes`` and node counts. Whatever the advisor
writes keeps the user's non-GPU gres (``gres:shard:1``) and clears the GPU part of the fields it
does not use (``tres_per_job=""`` when it writes ``tres_per_node``), so the job never says two
contradicting things.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

from slurm_pal.core.cluster import Cluster
from slurm_pal.core.hostlist import compress
from slurm_pal.core.labels import LabelEntry, LabelTable, LabelTableError
from slurm_pal.core.placement.base import Allocation, PlacementPolicy, PlacementResult
from slurm_pal.core.request import PlacementRequest
from slurm_pal.engine.jobdesc import (
    SETTABLE,
    TRES_FIELDS,
    GpuAsk,
    JobDescError,
    JobDescription,
    feature_set,
    gpu_ask,
    node_set,
    parse_tres,
)
from slurm_pal.engine.placing import place

__all__ = [
    "ACTIONS",
    "ADMIN_COMMENT_MAX",
    "NO_FIT",
    "SET_FIELDS",
    "WIRE_VERSION",
    "Decision",
    "LabelEntry",
    "LabelTable",
    "LabelTableError",
    "decide",
    "format_admin_comment",
    "labels_as_models",
    "parse_admin_comment",
    "parse_gpus_field",
    "plannable_request",
    "translate_model_types",
]

ADMIN_COMMENT_MAX = 1024
#: The wire protocol's version a decide answer carries: ``advisor.protocol.VERSION``, which a
#: test keeps equal. Stated here because the engine imports nothing of ``advisor/``, and the
#: protocol module stays free of numpy (the hooks import it through the client).
WIRE_VERSION = 1
NO_FIT = "no free GPUs fit now"
#: What an answer does: ``route`` rewrites the GPU request to the chosen GPUs; ``wait`` keeps
#: the request but sets its ``begin_time`` to the wait's bound, so Slurm starts it nowhere
#: before (neither reserving for it nor holding the jobs behind it) unless re-planning routes it
#: to GPUs that are not outliers for it first, and wherever it fits from then on; ``pass``
#: accepts the job as written; ``deny`` refuses it (only ``advisor.label_requests = "deny"``).
ACTIONS = ("route", "wait", "pass", "deny")
#: The job_desc fields job_submit.lua applies from ``set`` (PROTOCOL.md); others are ignored.
SET_FIELDS = (*SETTABLE, "admin_comment")
_PREFIX = "slurm-pal/"
_TOKEN_SAFE = re.compile(r"^[^\s=;]+$")
_UNSAFE = re.compile(r"[\s=;]")


def _tres_text(entry_name: str, gpu_type: str | None, count: int) -> str:
    head = f"gres:{entry_name}:{gpu_type}" if gpu_type else f"gres:{entry_name}"
    return f"{head}:{count}"


def labels_as_models(tres: str, labels: LabelTable) -> str:
    """GPU entries typed with a PM label rewritten to the label's GPU model
    (``gres:gpu:v100-a0b1:2`` -> ``gres:gpu:v100:2``), so the job is placed like any request
    for that model instead of picking its own bin. Other entries are kept verbatim."""
    out: list[str] = []
    for item in (part.strip() for part in tres.split(",") if part.strip()):
        try:
            (entry,) = parse_tres(item)
        except (JobDescError, ValueError):
            out.append(item)
            continue
        if entry.is_gpu and entry.type is not None and labels.is_label(entry.type):
            out.append(_tres_text("gpu", entry.type.split("-", 1)[0], entry.count))
        else:
            out.append(item)
    return ",".join(out)


def translate_model_types(tres: str, labels: LabelTable) -> str:
    """Drop GPU *model* types, which no GPU carries once its Type is a PM label:
    ``gres:gpu:v100:2`` -> ``gres:gpu:2``. Label-typed and untyped GPU entries and other gres
    are kept verbatim; untyped GPU entries are merged into one (at the first one's place).
    Fail-open: an entry that cannot be read is kept as written, and this never raises.

    Limitation: on a cluster with several models, the untyped request may land on another
    model (a job_desc field for "any label of model M" does not exist)."""
    items = [item.strip() for item in tres.split(",") if item.strip()]
    out: list[str | None] = []
    untyped_at: int | None = None
    untyped = 0
    changed = False
    for item in items:
        try:
            (entry,) = parse_tres(item)
        except (JobDescError, ValueError):
            out.append(item)
            continue
        if not entry.is_gpu or (entry.type is not None and not labels.is_model(entry.type)):
            out.append(item)
            continue
        changed = changed or entry.type is not None
        untyped += entry.count
        if untyped_at is None:
            untyped_at = len(out)
            out.append(None)
        else:
            changed = True
    if not changed:
        return tres
    if untyped_at is not None:
        out[untyped_at] = _tres_text("gpu", None, untyped)
    return ",".join(item for item in out if item is not None)


def _translations(job: JobDescription, labels: LabelTable) -> dict[str, str]:
    """Every tres field whose model-typed GPU entries need translating, translated."""
    out: dict[str, str] = {}
    for name in TRES_FIELDS:
        value = getattr(job, name)
        if value:
            translated = translate_model_types(value, labels)
            if translated != value:
                out[name] = translated
    return out


def _clean(text: str) -> str:
    return " ".join(text.split())


def _gpus_text(gpus: Mapping[str, Sequence[str]], counted: bool) -> str:
    parts = []
    for node, node_labels in gpus.items():
        if counted:
            items = [f"{lab}*{n}" if n > 1 else lab for lab, n in Counter(node_labels).items()]
        else:
            items = list(node_labels)
        parts.append(f"{node}:{'+'.join(items)}")
    return ";".join(parts)


def format_admin_comment(
    *,
    version: str,
    action: str,
    why: str,
    token: str | None = None,
    job_class: str | None = None,
    lv: float | None = None,
    gpus: Mapping[str, Sequence[str]] | None = None,
    exc: str | None = None,
    since: float | None = None,
    until: float | None = None,
    released: float | None = None,
) -> str:
    """``slurm-pal/<version> <action> r=<token> class=<C> lv=<x.xxxx> exc=<hostlist>
    since=<epoch> until=<epoch> released=<epoch> gpus=<node>:<l>+<l>;... why=<reason>``; absent
    values are left out, ``why`` is last and may hold spaces. ``exc`` names the nodes a waiting
    job was kept off (an older advisor's waits); ``since``/``until``: a waiting job is held from
    when it could first have started to its bound (its begin time); ``released``: when a route
    Slurm did not start was handed back to it (engine/stalled.py; never re-planned).

    At most :data:`ADMIN_COMMENT_MAX` characters: when too long, repeated labels are counted
    (``node:L*3``), then ``why`` is cut, then the gpus list is cut and ends in ``...``."""
    head = [f"{_PREFIX}{version}", action]
    if token is not None:
        if not _TOKEN_SAFE.match(token):
            raise ValueError(f"admin comment token {token!r} must not hold blanks, '=' or ';'")
        head.append(f"r={token}")
    if job_class is not None:  # informative only: an odd class name is made readable, not refused
        head.append(f"class={_UNSAFE.sub('_', job_class) or '_'}")
    if lv is not None:
        head.append(f"lv={lv:.4f}")
    if exc:
        head.append(f"exc={exc}")
    if since is not None:
        head.append(f"since={int(since)}")
    if until is not None:
        head.append(f"until={math.ceil(until)}")
    if released is not None:
        head.append(f"released={int(released)}")
    head_text = " ".join(head)
    why_text = f" why={_clean(why)}"
    if not gpus:
        return (head_text + why_text)[:ADMIN_COMMENT_MAX]
    gpus_text = _gpus_text(gpus, counted=False)

    def joined() -> str:
        return f"{head_text} gpus={gpus_text}{why_text}"

    if len(joined()) > ADMIN_COMMENT_MAX:
        gpus_text = _gpus_text(gpus, counted=True)
    if len(joined()) > ADMIN_COMMENT_MAX:
        why_text = why_text[:200]
    if len(joined()) > ADMIN_COMMENT_MAX:
        room = ADMIN_COMMENT_MAX - len(head_text) - len(" gpus=") - len(why_text) - len("...")
        gpus_text = gpus_text[: max(room, 0)] + "..."
    return joined()[:ADMIN_COMMENT_MAX]


def parse_admin_comment(text: str) -> dict[str, str] | None:
    """The fields of an admin comment written by :func:`format_admin_comment` (``version``,
    ``action``, and ``r``/``class``/``lv``/``gpus``/``why`` when present); None when the text is
    not one (someone else's comment, or garbled). A comment that opens with a double quote is
    read inside its quotes: a re-planning round writes through scontrol's stdin, which stores
    them (:func:`slurm_pal.adapters.slurm.update.stdin_line`); a reader that cut it short
    (``scontrol show job`` splits it at its ``key=`` words) may have kept the first only."""
    if not isinstance(text, str):
        return None
    if text.startswith('"'):
        text = text[1:-1] if len(text) > 1 and text.endswith('"') else text[1:]
    if not text.startswith(_PREFIX):
        return None
    head, sep, why = text.partition(" why=")
    words = head.split(" ")
    if len(words) < 2 or words[1] not in ACTIONS:
        return None
    out = {"version": words[0][len(_PREFIX) :], "action": words[1]}
    for word in words[2:]:
        key, eq, value = word.partition("=")
        if not eq or not key or key in out:
            return None
        out[key] = value
    if sep:
        out["why"] = why
    return out


def parse_gpus_field(value: str) -> dict[str, list[str]]:
    """The ``gpus=`` value of an admin comment -> ``{node: [label, ...]}`` (counted labels
    expanded; a list cut with ``...`` gives the nodes that are complete)."""
    out: dict[str, list[str]] = {}
    truncated = value.endswith("...")
    parts = value.removesuffix("...").split(";")
    if truncated:
        parts = parts[:-1]
    for part in parts:
        node, sep, items = part.partition(":")
        if not sep or not node:
            raise ValueError(f"bad gpus entry {part!r}; expected NODE:LABEL+LABEL")
        labels: list[str] = []
        for item in items.split("+"):
            label, star, count = item.partition("*")
            if not label or (star and not count.isdigit()):
                raise ValueError(f"bad label {item!r} in gpus entry {part!r}")
            labels.extend([label] * (int(count) if star else 1))
        out[node] = labels
    return out


@dataclass(frozen=True)
class Decision:
    """The answer to one decide request (see :meth:`to_wire`) plus what it was based on."""

    action: Literal["route", "wait", "pass", "deny"]
    set_fields: Mapping[str, str | int]
    job_class: str | None
    reason: str
    lv_product: float | None = None
    token: str | None = None
    allocation: Allocation | None = None
    request: PlacementRequest | None = None
    encoding: int | None = None
    """1-4 for the routing encodings of PROTOCOL.md, 0 for a per-task job; None when passed."""
    retry: bool = False
    """Passed or waiting only for want of suitable free GPUs now: re-planning retries it."""
    kept_off: tuple[str, ...] = ()
    """``wait``: the nodes the advisor keeps the job off (besides the user's own exclusions)."""
    waits_off: tuple[int, ...] = ()
    """``wait``: the free GPUs (cluster rows) the policy holds the job off."""
    wait_until: float | None = None
    """``wait``: the job's begin time, the latest it is held to (epoch seconds)."""
    left_to_slurm: bool = False
    """``pass`` of a job the policy would place as packing does (``allocation``: where Slurm
    is expected to put it, held as a reservation until Slurm's next read shows the job)."""

    def to_wire(self) -> dict[str, object]:
        """PROTOCOL.md's decide answer."""
        lv = self.lv_product
        return {
            "v": WIRE_VERSION,
            "ok": True,
            "action": self.action,
            "set": dict(self.set_fields),
            "class": self.job_class,
            "reason": self.reason,
            "lv": lv if lv is not None and math.isfinite(lv) else None,
            "token": self.token,
        }

    def with_token(self, token: str) -> Decision:
        """The same answer as the decision ``token`` names (in its admin comment's ``r=``
        too): an answer given again to an identical request is a decision of its own."""
        if self.token is None or token == self.token:
            return self
        if not _TOKEN_SAFE.match(token):
            raise ValueError(f"admin comment token {token!r} must not hold blanks, '=' or ';'")
        fields = dict(self.set_fields)
        comment = fields.get("admin_comment")
        if isinstance(comment, str):
            # format_admin_comment writes `r=<token>` as a word of its head, "why=" after it
            fields["admin_comment"] = comment.replace(f" r={self.token} ", f" r={token} ", 1)
        return replace(self, set_fields=MappingProxyType(fields), token=token)


def _pass(
    reason: str,
    *,
    job: JobDescription,
    labels: LabelTable,
    job_class: str | None,
    version: str,
    request: PlacementRequest | None = None,
    retry: bool = False,
) -> Decision:
    """Accept the job as written, but with model types translated and the reason noted."""
    fields: dict[str, str | int] = dict(_translations(job, labels))
    fields["admin_comment"] = format_admin_comment(
        version=version, action="pass", job_class=job_class, why=reason
    )
    return Decision(
        "pass", MappingProxyType(fields), job_class, reason, request=request, retry=retry
    )


def _wait(
    reason: str,
    *,
    since: float,
    until: float,
    job: JobDescription,
    labels: LabelTable,
    job_class: str,
    version: str,
    request: PlacementRequest,
    token: str,
) -> Decision:
    """Keep the job as written (model types translated) but not before ``until``, its bound:
    Slurm starts a job nowhere before its begin time, so the hold is exactly what the policy
    decided, and it ends by itself even if the advisor is gone. Re-planning routes it earlier
    when GPUs that are not outliers for it free up."""
    fields: dict[str, str | int] = dict(_translations(job, labels))
    fields["begin_time"] = math.ceil(until)
    fields["admin_comment"] = format_admin_comment(
        version=version,
        action="wait",
        token=token,
        job_class=job_class,
        since=since,
        until=until,
        why=reason,
    )
    return Decision(
        "wait",
        MappingProxyType(fields),
        job_class,
        reason,
        token=token,
        request=request,
        retry=True,
        wait_until=math.ceil(until),
    )


def _remainder(text: str | None) -> str:
    """A tres field without its GPU entries (what stays when the advisor rewrites the GPUs)."""
    return ",".join(e.text for e in parse_tres(text) if not e.is_gpu)


def _with_other(gpu_text: str, original: str | None) -> str:
    other = _remainder(original)
    return f"{gpu_text},{other}" if other else gpu_text


def _encode(
    job: JobDescription, ask: GpuAsk, allocation: Allocation, labels: LabelTable
) -> tuple[dict[str, str | int], dict[str, list[str]], int]:
    """``set`` fields for the allocation, the chosen labels per node, and the encoding used.
    KeyError when a chosen GPU has no label (cluster and labels.json disagree)."""
    chosen: dict[str, list[str]] = {}
    for node, index in zip(allocation.nodes, allocation.local_indices, strict=True):
        chosen.setdefault(node, []).append(labels.label(node, index))
    nodes = list(chosen)
    k = len(nodes)
    out: dict[str, str | int] = {"req_nodes": compress(nodes), "min_nodes": k, "max_nodes": k}
    counters = [Counter(chosen[node]) for node in nodes]
    totals = {sum(c.values()) for c in counters}
    written: set[str] = set()
    if ask.per_task is not None:
        encoding = 0
    elif all(c == counters[0] for c in counters):
        encoding = 1 if k == 1 else 2
        typed = ",".join(_tres_text("gpu", lab, n) for lab, n in sorted(counters[0].items()))
        out["tres_per_node"] = _with_other(typed, job.tres_per_node)
        written.add("tres_per_node")
    elif len(totals) == 1:
        encoding = 3
        out["tres_per_node"] = _with_other(_tres_text("gpu", None, totals.pop()), job.tres_per_node)
        written.add("tres_per_node")
    else:
        # Typed only with a single label: Slurm wants every type of a multi-node per-job
        # request on every node (testbed/NOTES.md finding 2), which one shared label is.
        encoding = 4
        kinds = set().union(*counters)
        only = next(iter(kinds)) if len(kinds) == 1 else None
        out["tres_per_job"] = _with_other(
            _tres_text("gpu", only, allocation.n_gpus), job.tres_per_job
        )
        written.add("tres_per_job")
    # Clear the GPU part of the user's other fields (it would contradict what was written);
    # fields that keep their GPUs (tres_per_task) only lose model types.
    for name in ("tres_per_node", "tres_per_job", "tres_per_task"):
        value = getattr(job, name)
        if name in written or not value:
            continue
        if encoding == 0 and name == "tres_per_task":
            translated = translate_model_types(value, labels)
            if translated != value:
                out[name] = translated
            continue
        if any(e.is_gpu for e in parse_tres(value)):
            out[name] = _remainder(value)
    return out, chosen, encoding


def _request(
    job: JobDescription, ask: GpuAsk, job_class: str, labels: LabelTable, job_id: str
) -> PlacementRequest:
    """The PlacementRequest the job describes (JobDescError for hostlists/features it cannot
    read). Per-node GPUs without ``min_nodes`` mean one node, as in Slurm. The job's time
    limit is what the advisor expects it to run (an unlimited or unset one: unknown)."""
    required = node_set(job.req_nodes, "req_nodes")
    excluded = node_set(job.exc_nodes, "exc_nodes")
    features = feature_set(job.features)
    model = ask.gpu_type if ask.gpu_type is not None and labels.is_model(ask.gpu_type) else None
    min_nodes, max_nodes = job.min_nodes, job.max_nodes
    per_node = None
    if ask.per_task is not None:
        tasks = job.num_tasks or min_nodes or 1
        gpus = ask.per_task * tasks
    elif ask.per_node is not None:
        per_node = ask.per_node
        nodes = min_nodes if min_nodes is not None else 1
        gpus = ask.per_job if ask.per_job is not None else per_node * nodes
    else:
        gpus = ask.per_job or 0
    return PlacementRequest(
        job_id=job_id,
        job_class=job_class,
        gpus=gpus,
        gpus_per_node=per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        required_nodes=required,
        excluded_nodes=excluded,
        required_features=features,
        gpu_model=model,
        time_limit_s=job.time_limit_s,
    )


def _why_not_modelled(job: JobDescription, ask: GpuAsk, labels: LabelTable) -> str | None:
    """Why a GPU job is passed before any placement, or None when it can be placed."""
    named = [t for t in ask.types if t is not None] or (
        [ask.gpu_type] if ask.gpu_type is not None else []
    )
    pinned = [t for t in named if labels.is_label(t)]
    if pinned:
        return f"GPUs pinned by the user to PM label(s) {', '.join(pinned)}"
    if job.modify:
        return "job modification: only model-typed GPUs are translated"
    if job.array is not None:
        return "job array: Slurm places each task"
    if ask.per_socket is not None:
        return "GPUs per socket cannot be modelled"
    if ask.mixed_types:
        shown = ", ".join(t or "untyped" for t in ask.types)
        return f"several GPU types in one job ({shown}) cannot be modelled"
    if ask.gpu_type is not None and not labels.is_model(ask.gpu_type):
        valid = ", ".join(sorted(labels.models))
        return f"unknown GPU type {ask.gpu_type!r} (models: {valid}, or a PM label)"
    if ask.per_task is not None and (ask.per_node is not None or ask.per_job is not None):
        return "GPUs per task together with GPUs per node or per job cannot be modelled"
    return None


def _partition_candidates(
    job: JobDescription,
    cluster: Cluster,
    partition_nodes: Mapping[str, Iterable[str]] | None,
    default_partition: str | None,
) -> list[tuple[str | None, frozenset[str]]] | str:
    """(partition, nodes to exclude for it) to try in order, or why none can be used."""
    if partition_nodes is None:
        return [(None, frozenset())]
    names = [p.strip() for p in job.partition.split(",") if p.strip()]
    if not names and default_partition:
        names = [default_partition]
    if not names:
        return [(None, frozenset())]
    unknown = [p for p in names if p not in partition_nodes]
    if unknown:
        valid = ", ".join(sorted(partition_nodes))
        return f"unknown partition(s) {', '.join(unknown)} (valid: {valid})"
    everyone = frozenset(cluster.node_names)
    return [(p, everyone - frozenset(partition_nodes[p])) for p in names]


def _placeable(
    job: JobDescription,
    ask: GpuAsk,
    *,
    job_class: str,
    labels: LabelTable,
    cluster: Cluster,
    job_id: str,
) -> tuple[PlacementRequest | None, str | None]:
    """The request ``job`` asks the placement for, and why it cannot be placed whatever is
    free (None: it can). The one list of those reasons, for ``decide`` and the re-planner."""
    why = _why_not_modelled(job, ask, labels)
    if why is not None:
        return None, why
    try:
        request = _request(job, ask, job_class, labels, job_id)
    except JobDescError as error:
        return None, f"cannot model the request: {error}"
    if job.min_nodes is None and job.num_tasks is not None and job.num_tasks > request.gpus:
        # Slurm derives the node count from the tasks' CPUs, which the advisor does not see;
        # pinning the GPUs' node count could make Slurm reject a job it would accept.
        return request, (
            f"{job.num_tasks} tasks on {request.gpus} GPU(s) without a node count: Slurm "
            "derives the nodes from the tasks' CPUs"
        )
    problem = request.problem()
    if problem is not None:
        return request, f"cannot be satisfied: {problem}"
    if job_class not in cluster.classes:
        valid = ", ".join(cluster.class_order)
        return request, (
            f"class {job_class!r} has no PM-scores in the active campaign (valid: {valid})"
        )
    return request, None


def plannable_request(
    job: JobDescription, *, job_class: str, labels: LabelTable, cluster: Cluster, job_id: str
) -> PlacementRequest | None:
    """The placement request ``decide`` would place for ``job``, or None when it would pass
    the job whatever is free. Cheap: no placement; a re-planning round needs every pending
    job's size before it places any."""
    try:
        ask = gpu_ask(job)
    except JobDescError:
        return None
    if ask is None:
        return None
    request, why = _placeable(
        job, ask, job_class=job_class, labels=labels, cluster=cluster, job_id=job_id
    )
    return None if why is not None else request


def decide(
    job: JobDescription,
    *,
    job_class: str,
    class_reason: str,
    cluster: Cluster,
    labels: LabelTable,
    policy: PlacementPolicy,
    version: str,
    token: str,
    partition_nodes: Mapping[str, Iterable[str]] | None = None,
    default_partition: str | None = None,
    leave_packing: bool = False,
    now: float | None = None,
    waiting_since: float | None = None,
    request: PlacementRequest | None = None,
) -> Decision:
    """Route ``job`` to the GPUs ``policy`` picks among ``cluster``'s free GPUs, or pass it.

    ``now`` (epoch seconds) is the cluster's clock for a policy that weighs waiting (when the
    busy GPUs free up: ``cluster.busy_until``); ``waiting_since``: the job has been held since
    then (a re-planning round), so its wait counts against the bound from there.

    ``leave_packing``: a pick that is packing's own with nothing to avoid
    (``PlacementResult.as_packing``) is passed with the token and the expected allocation
    (``left_to_slurm``) instead of routed: Slurm packs it the same, and no pin can go stale.

    ``partition_nodes`` (partition -> its nodes) keeps the chosen nodes inside the job's
    partition (Slurm rejects a node list outside it); a job listing several partitions is
    placed in each and gets the best LV product (the first listed on a tie); without a
    partition the ``default_partition`` applies. Omitted: no partition restriction.
    """
    common: dict[str, Any] = {"job": job, "labels": labels, "version": version}
    try:
        ask = gpu_ask(job)
    except JobDescError as error:
        return _pass(f"cannot read the GPU request: {error}", job_class=job_class, **common)
    if ask is None:
        return Decision("pass", MappingProxyType({}), None, "no GPUs asked")
    if request is None:
        job_id = str(job.job_id) if job.job_id is not None else token
        request, why = _placeable(
            job, ask, job_class=job_class, labels=labels, cluster=cluster, job_id=job_id
        )
        if why is not None:
            return _pass(why, job_class=job_class, request=request, **common)
    assert request is not None
    candidates = _partition_candidates(job, cluster, partition_nodes, default_partition)
    if isinstance(candidates, str):
        if now is not None:
            cluster.clock = now
            if waiting_since is not None:
                request = replace(request, waited_s=max(0.0, now - waiting_since))
        return _pass(candidates, job_class=job_class, request=request, **common)
    placement = place(
        policy,
        request,
        cluster,
        now=now,
        waiting_since=waiting_since,
        candidates=candidates,
        leave_packing=leave_packing,
    )
    request, best, reasons = placement.request, placement.best, placement.reasons
    if best is None or best.allocation is None:
        if placement.wait_until is not None:
            since = cluster.clock - request.waited_s
            decision = _wait(
                f"{'; '.join(reasons)}; re-planning routes it when other GPUs free up",
                since=since,
                until=placement.wait_until,
                job_class=job_class,
                request=request,
                token=token,
                **common,
            )
            return replace(decision, waits_off=placement.waits_off)
        return _pass(
            f"{NO_FIT} ({'; '.join(reasons)}); re-planning retries",
            job_class=job_class,
            request=request,
            retry=True,
            **common,
        )
    allocation = best.allocation
    if placement.left_to_slurm:
        reason = f"{allocation.reason}; packing's own pick: left to Slurm; class {job_class}"
        fields: dict[str, str | int] = dict(_translations(job, labels))
        fields["admin_comment"] = format_admin_comment(
            version=version, action="pass", token=token, job_class=job_class, why=reason
        )
        return replace(_placed("pass", fields, job_class, reason, best, token), left_to_slurm=True)
    try:
        fields, chosen, encoding = _encode(job, ask, allocation, labels)
    except KeyError as error:
        return _pass(
            f"cluster and labels.json disagree: {error.args[0]}",
            job_class=job_class,
            request=best.request,
            **common,
        )
    reason = f"{allocation.reason}; class {job_class}: {class_reason}"
    fields["admin_comment"] = format_admin_comment(
        version=version,
        action="route",
        token=token,
        job_class=job_class,
        lv=allocation.lv_product,
        gpus=chosen,
        why=reason,
    )
    return replace(_placed("route", fields, job_class, reason, best, token), encoding=encoding)


def _placed(
    action: Literal["route", "pass"],
    fields: Mapping[str, str | int],
    job_class: str,
    reason: str,
    best: PlacementResult,
    token: str,
) -> Decision:
    """A decision that carries the policy's allocation (routed, or left to Slurm there)."""
    assert best.allocation is not None
    return Decision(
        action,
        MappingProxyType(dict(fields)),
        job_class,
        reason,
        lv_product=best.allocation.lv_product,
        token=token,
        allocation=best.allocation,
        request=best.request,
    )
