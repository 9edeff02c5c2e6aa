"""What a job is on the HTTP side of the device worker (``service.worker.DeviceWorker`` makes, sends and
answers them): its record (``Job``: its slot, where its tensors lie there, its future), what a request gets
back (``Result``, ``GraphResult``), the numbers its templates go by in the worker (``TemplateIds``), the
room for messages in flight (``Window``), what every job of one descriptor needs (``Facts``) and what a
connection's repeated request keeps of its job (``Repeatable``), and how tensors are laid out in a slot.
"""
from __future__ import annotations

import asyncio
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import framing
from .framing import Template
from .limits import TEMPLATES
from .operators import OperatorDesc
from .slots import Slot, align, write_in_thread


LARGE = 1 << 20  # copies above this size run in a thread (numpy releases the GIL) to keep the loop free


async def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    if src.nbytes > LARGE:  # to the end, even when the request is cancelled meanwhile (see write_in_thread)
        await write_in_thread(np.copyto, dst, src)
    else:
        dst[...] = src




class Source(Protocol):
    """An input whose bytes are written into the job's slot by the source itself (shared_memory.RegionInput)."""

    nbytes: int

    async def fill(self, dst: np.ndarray) -> None: ...


class TemplateIds:
    """Numbers for job templates: what a lone job says to the worker besides its tensors' bytes (its
    pickled descriptor, its slot, where its tensors lie in it). A serving client repeats requests of
    one shape, and a slot goes back to the next request, so one template serves request after
    request: the first job of a template sends it, numbered, and later ones send only the number
    (a "go": see framing), which the worker answers by replaying what it did for the first one.
    At most ``limit`` numbers; a new template takes a number given back (its slot was replaced) or
    the least recently used one, and its definition replaces the old one in the worker."""

    def __init__(self, limit: int = TEMPLATES) -> None:
        self._ids: OrderedDict[Template, int] = OrderedDict()
        self._free: list[int] = []
        self._limit = limit
        self.version = 0  # changes whenever a number given out may come to name another template

    def number(self, template: Template) -> tuple[int, bool]:
        """The template's number, and whether it is new (the worker must be told the template first)."""
        tid = self._ids.get(template)
        if tid is not None:
            self._ids.move_to_end(template)
            return tid, False
        if self._free:
            tid = self._free.pop()
        elif len(self._ids) < self._limit:
            tid = len(self._ids)
        else:
            tid = self._ids.popitem(last=False)[1]
            self.version += 1
        self._ids[template] = tid
        return tid, True

    def drop_slot(self, path: str) -> None:
        """Forget the templates of a slot that is gone (the worker forgets them with its mapping)."""
        for template in [t for t in self._ids if t[1] == path]:
            self._free.append(self._ids.pop(template))
            self.version += 1


class Window:
    """Room for the messages handed to the worker and not answered yet (IN_FLIGHT at most). Nothing
    waits on it: the queue is pumped (DeviceWorker._pump) where room may have opened."""

    def __init__(self, size: int) -> None:
        self.free = size

    def take(self) -> None:
        assert self.free > 0
        self.free -= 1

    def release(self) -> None:
        self.free += 1


@dataclass
class Result:
    output: memoryview          # the output buffer inside the slot; valid until release()
    kernel_seconds: float       # of the dispatch, shared by the jobs of a batch
    queue_seconds: float
    _job: Any = field(repr=False)
    batch_size: int = 1         # jobs that ran in the same dispatch

    def release(self) -> None:
        """Hand the slot back once the output has been read."""
        self.output.release()
        self._job.release()


@dataclass
class GraphResult:
    outputs: list[memoryview]   # the graph outputs' buffers inside the slot, in index order; valid until release()
    kernel_seconds: float       # of the command buffer (every dispatch of the plan)
    queue_seconds: float
    _job: Any = field(repr=False)

    def release(self) -> None:
        """Hand the slot back once the outputs have been read."""
        for view in self.outputs:
            view.release()
        self._job.release()


class Facts:
    """What every job of one descriptor needs from it, worked out once per canonical key (equal keys,
    equal descriptors): the descriptor's properties are computed on each read (``concatenable``, the
    batcher's question for every queued job, about 11 us)."""

    __slots__ = ("output_bytes", "concatenable")

    def __init__(self, op: OperatorDesc) -> None:
        self.output_bytes = op.output.total_bytes
        self.concatenable = op.concatenable


class Repeatable:
    """One request layout that a connection sends over and over (http_direct.Repeat keeps it), for
    ``submit_repeat``: what ``run`` works out for every request (the descriptor's facts, where each
    input goes in the slot, the output's place, the slot's size) worked out once; and the slot and
    template number of its last job, taken again while they hold (the slot free and still the pool's,
    the number still naming its template in this worker)."""

    __slots__ = ("op", "key", "in_place", "copies", "inputs", "output", "slot_bytes", "input_bytes", "concatenable", "slot",
                 "numbered")

    def __init__(self, op: OperatorDesc, key: bytes, in_place: bool, spans: Sequence[tuple[int, int, int]], facts: Facts) -> None:
        self.op, self.key, self.in_place, self.concatenable = op, key, in_place, facts.concatenable
        # spans: each input's (offset in the request's tensor bytes, its bytes there, its buffer's bytes: at
        # least as many, the rest zero)
        self.inputs, cursor = lay_out([total for _, _, total in spans], 0)
        self.copies = tuple((at, n, total, offset) for (at, n, total), (offset, _) in zip(spans, self.inputs))
        self.output = self.inputs[0] if in_place else (cursor, facts.output_bytes)
        self.slot_bytes = max(1, self.output[0] + self.output[1], cursor)
        self.input_bytes = sum(total for _, _, total in spans)
        self.slot: Slot | None = None
        self.numbered: tuple[TemplateIds, int, int] | None = None  # (numbering, its version, template number) for ``slot``


@dataclass(slots=True)
class Job:
    id: int
    op: OperatorDesc | None     # None: a graph job (``graph``, ``outputs``)
    slot: Slot
    inputs: list[tuple[int, int]]
    output: tuple[int, int]
    in_place: bool
    future: asyncio.Future = field(repr=False)
    key: bytes = b""  # the pickled descriptor: what crosses to the worker, and its plan cache key
    concatenable: bool = False  # op.concatenable (see Facts)
    batchable: bool = False  # may run in one dispatch with the jobs of the same key queued beside it
    batch_limit: int = 1     # jobs in that dispatch at most (the model's, see DeviceWorker.batch_limit)
    waiting: Callable[[int], None] | None = field(default=None, repr=False)  # told +1 queued, -1 out of the queue
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float = 0.0
    parked_at: float | None = None  # a graph job the worker holds while its pipelines build (its "building")
    released: bool = False
    graph: bytes | None = None   # a graph job: its GraphPlan pickled
    outputs: tuple[tuple[int, int], ...] = ()
    # the future's done callback that answers the job's request (dataplane.execution.start), called by
    # the reply's own handler rather than one loop turn later
    on_done: Callable[[asyncio.Future], None] | None = field(default=None, repr=False)

    @property
    def template(self) -> Template:
        """What the worker needs besides the job's id (see TemplateIds)."""
        return (self.key, self.slot.mapping.path, self.slot.mapping.size, tuple(self.inputs), self.output, self.in_place)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slot.busy = False


def lay_out(sizes: list[int], cursor: int) -> tuple[list[tuple[int, int]], int]:
    """(offset, size) of buffers placed one after the other from ``cursor``, aligned; and the end."""
    offsets = []
    for n in sizes:
        offsets.append((cursor, n))
        cursor = align(cursor + n)
    return offsets, cursor


def descriptor_key(op: OperatorDesc) -> bytes:
    """The canonical key of ``op``: its pickled bytes, what names it to the worker, its plan caches and the
    batcher. Equal descriptors give equal keys (see service.descriptors.canonical); callers compute it once
    per request and the header caches keep it."""
    return pickle.dumps(op, framing.PROTOCOL)
