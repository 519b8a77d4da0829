"""A model of PyTorch's CUDA caching allocator, replayed over a list of alloc/free events.

The estimate (``workbench.capture.estimate``) records, on fake tensors, the order in which a
training step creates and releases tensor storages. What a GPU would then *allocate* and *reserve*
is decided by the caching allocator's rules, which this module replays with plain integers (no
torch, no device). The rules follow c10/cuda/CUDACachingAllocator.cpp with its default settings
(no ``PYTORCH_CUDA_ALLOC_CONF``, no expandable segments, one stream):

* every request is rounded up to a multiple of 512 B (``MIN_BLOCK_SIZE``; smaller ones become 512);
  a request of 0 B takes no memory;
* requests of at most 1 MiB (``SMALL_SIZE``) are served from the *small* pool, whose segments are
  2 MiB (``SMALL_BUFFER``); larger requests use the *large* pool: below 10 MiB (``MIN_LARGE_ALLOC``)
  a new segment is 20 MiB (``LARGE_BUFFER``), from 10 MiB on a segment of the request rounded up to
  2 MiB (``ROUND_LARGE``);
* a request takes the smallest free block of its pool that is big enough (ties: the lowest
  address); a free block is split when what would remain is at least 512 B (small pool) or more
  than 1 MiB (large pool); otherwise the whole block is handed out and counted as allocated;
* a freed block merges with free neighbours of the same segment; segments are returned to CUDA only
  by :meth:`CachingAllocatorModel.empty_cache` (``torch.cuda.empty_cache()``), and only those that are
  one whole free block: a segment that still holds one live block keeps all its holes. A replay
  (:func:`replay_allocator`) never calls it, so there reserved memory only grows.

``allocated`` counts block sizes (what ``torch.cuda.memory_allocated`` reports), ``reserved``
counts segment sizes (``torch.cuda.memory_reserved``). The CUDA context, cuDNN/cuBLAS libraries
and anything else outside the caching allocator are in neither.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

from workbench.errors import BadArgument

__all__ = [
    # constants of CUDACachingAllocator.cpp
    "MIN_BLOCK_SIZE",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    # pure rules
    "round_size",
    "allocation_size",
    "is_small",
    # replay
    "CachingAllocatorModel",
    "AllocatorReplay",
    "replay_allocator",
]

MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" allocation is 1 MiB
SMALL_BUFFER = 2 << 20  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
LARGE_BUFFER = 20 << 20  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
ROUND_LARGE = 2 << 20  # kRoundLarge: round up large allocations to 2 MiB


def round_size(nbytes: int) -> int:
    """Bytes a request of ``nbytes`` asks the allocator for (multiple of 512, at least 512)."""
    if nbytes < 0:
        raise BadArgument(f"negative request: {nbytes}")
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool."""
    return rounded <= SMALL_SIZE


def allocation_size(rounded: int) -> int:
    """Size of the new segment (cudaMalloc) made when no cached block fits a rounded request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass
class _Block:
    addr: int
    size: int
    segment: int  # id of the segment (cudaMalloc) this block lives in
    small: bool
    allocated: bool = False
    prev: "_Block | None" = field(default=None, repr=False)
    next: "_Block | None" = field(default=None, repr=False)


class CachingAllocatorModel:
    """The caching allocator's state: segments, blocks, free lists, and the allocated/reserved counters.

    >>> m = CachingAllocatorModel()
    >>> h = m.malloc(1000)          # rounded to 1024 B, small pool, new 2 MiB segment
    >>> m.allocated_bytes, m.reserved_bytes
    (1024, 2097152)
    >>> m.free(h); m.allocated_bytes
    0
    """

    def __init__(self, max_split_size: int | None = None) -> None:
        # PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb: blocks of at least this size are never split, and a
        # request below it never takes one (None: torch's default, no limit)
        self.max_split_size = max_split_size
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # small? -> sorted (size, addr)
        self._by_addr: dict[int, _Block] = {}
        self._next_addr = 1 << 32
        self._segments: dict[int, int] = {}  # segment id -> size
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.requested_bytes = 0  # sum of live requests before rounding (tensor bytes)
        self.peak_requested_bytes = 0
        self._requests: dict[int, int] = {}

    # -- free lists ------------------------------------------------------------------------
    def _add_free(self, b: _Block) -> None:
        bisect.insort(self._free[b.small], (b.size, b.addr))

    def _remove_free(self, b: _Block) -> None:
        lst = self._free[b.small]
        i = bisect.bisect_left(lst, (b.size, b.addr))
        if i >= len(lst) or lst[i] != (b.size, b.addr):  # pragma: no cover - internal invariant
            raise AssertionError("free list out of sync")
        del lst[i]

    # -- public ----------------------------------------------------------------------------
    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def largest_free_block(self) -> int:
        sizes = [lst[-1][0] for lst in self._free.values() if lst]
        return max(sizes, default=0)

    @property
    def free_in_reserved_bytes(self) -> int:
        """Reserved minus allocated: the bytes of all free blocks (holes) inside segments."""
        return self.reserved_bytes - self.allocated_bytes

    def empty_cache(self) -> int:
        """Release every segment that is entirely free, as ``torch.cuda.empty_cache()`` does; return the
        bytes released. Free blocks inside segments that also hold a live block stay reserved.

        >>> m = CachingAllocatorModel()
        >>> a, b = m.malloc(8 << 20), m.malloc(8 << 20)   # both in one 20 MiB segment
        >>> c = m.malloc(64 << 20)                        # a segment of its own
        >>> m.free(a); m.free(c)
        >>> m.empty_cache() == 64 << 20, m.reserved_bytes == 20 << 20
        (True, True)
        """
        released = 0
        for small, lst in self._free.items():
            keep = []
            for size, addr in lst:
                block = self._by_addr[addr]
                if block.prev is None and block.next is None and size == self._segments[block.segment]:
                    del self._by_addr[addr]
                    del self._segments[block.segment]
                    released += size
                else:
                    keep.append((size, addr))
            self._free[small] = keep
        self.reserved_bytes -= released
        return released

    def release_oversize(self, nbytes: int) -> bool:
        """What torch does first when a new segment would pass the cap and ``max_split_size`` is set
        (``release_available_cached_blocks``): release the smallest cached oversize block (at least
        ``max_split_size``, never split, so a whole segment) that is as large as the request (raised to
        ``max_split_size``); failing one, release oversize blocks from the largest down until that much is
        released. True when enough was; the released blocks stay released either way. Without
        ``max_split_size``: False, nothing released (torch goes straight to releasing every free segment).

        >>> m = CachingAllocatorModel(max_split_size=64 << 20)
        >>> a, b = m.malloc(100 << 20), m.malloc(200 << 20); m.free(a); m.free(b)
        >>> m.release_oversize(90 << 20), m.reserved_bytes >> 20   # the 100 MiB one is enough
        (True, 200)
        """
        mss = self.max_split_size
        size = round_size(int(nbytes))
        if mss is None or is_small(size):
            return False
        key = max(size, mss)
        lst = self._free[False]
        i = bisect.bisect_left(lst, (key, -1))
        picked = [lst[i]] if i < len(lst) else []
        if not picked:
            total = 0
            for bsize, addr in reversed(lst):
                if total >= key or bsize < mss:
                    break
                picked.append((bsize, addr))
                total += bsize
        released = 0
        for bsize, addr in picked:
            block = self._by_addr[addr]
            if block.prev is not None or block.next is not None:  # pragma: no cover - oversize blocks are whole
                continue
            self._remove_free(block)
            del self._by_addr[addr]
            del self._segments[block.segment]
            released += bsize
        self.reserved_bytes -= released
        return released >= key

    def add_segment(self, nbytes: int) -> None:
        """A segment reserved before the replay begins, all of it free (a segment that predates a recorded
        history: cached memory the process already held). 2 MiB goes to the small pool, anything else to
        the large one (torch never makes a large-pool segment of 2 MiB without expandable segments).

        >>> m = CachingAllocatorModel(); m.add_segment(16 << 20)
        >>> h = m.malloc(12 << 20); m.reserved_bytes >> 20   # the cached segment serves it
        16
        """
        size = int(nbytes)
        if size <= 0:
            return
        small = size == SMALL_BUFFER
        block = _Block(addr=self._next_addr, size=size, segment=self._next_addr, small=small)
        self._next_addr += size + (1 << 21)
        self._segments[block.segment] = size
        self._by_addr[block.addr] = block
        self._add_free(block)
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def _cached_fit(self, size: int) -> int:
        """Index in its free list of the cached block a rounded request takes, or -1 (a new segment)."""
        lst = self._free[is_small(size)]
        i = bisect.bisect_left(lst, (size, -1))
        if i >= len(lst):
            return -1
        mss = self.max_split_size
        if mss is not None and not is_small(size):
            bsize = lst[i][0]
            # torch: no oversize block for a request below max_split_size; an oversize request takes
            # an oversize block only when it wastes less than a large buffer
            if (size < mss and bsize >= mss) or (size >= mss and bsize >= size + LARGE_BUFFER):
                return -1
        return i

    def would_grow(self, nbytes: int) -> int:
        """Bytes of the new segment ``malloc(nbytes)`` would reserve (0: a cached block serves it)."""
        if nbytes == 0:
            return 0
        size = round_size(nbytes)
        return 0 if self._cached_fit(size) >= 0 else allocation_size(size)

    def malloc(self, nbytes: int, segment_address: int | None = None) -> int | None:
        """Allocate ``nbytes``; returns a handle (the block address), or None for a 0-byte request.

        ``segment_address``: where a new segment lands if this request needs one (a replay of a real trace
        passes cudaMalloc's address). Among free blocks of the same size the allocator takes the lowest
        address, so which cached block is reused, and whether a later request finds room, can depend on
        where the driver put the segments; without it new segments get increasing addresses."""
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = is_small(size)
        lst = self._free[small]
        i = self._cached_fit(size)
        if i >= 0:
            bsize, baddr = lst[i]
            del lst[i]
            block = self._by_addr[baddr]
        else:
            seg = allocation_size(size)
            addr = self._next_addr if segment_address is None else int(segment_address)
            block = _Block(addr=addr, size=seg, segment=addr, small=small)
            self._segments[block.segment] = seg
            if segment_address is None:
                self._next_addr += seg + (1 << 21)  # a gap: blocks of different segments never touch
            self._by_addr[block.addr] = block
            self.reserved_bytes += seg
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        remaining = block.size - size
        split = remaining >= MIN_BLOCK_SIZE if small else (
            remaining > SMALL_SIZE and (self.max_split_size is None or size < self.max_split_size))
        if split:
            rest = _Block(addr=block.addr + size, size=remaining, segment=block.segment, small=small,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._by_addr[rest.addr] = rest
            self._add_free(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.requested_bytes += nbytes
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        self._requests[block.addr] = nbytes
        return block.addr

    def free(self, handle: int | None) -> None:
        """Return a block to its pool, merging it with free neighbours of its segment."""
        if handle is None:
            return
        block = self._by_addr.get(handle)
        if block is None or not block.allocated:
            raise KeyError(f"free of an unknown or already free block at {handle:#x}")
        block.allocated = False
        self.allocated_bytes -= block.size
        self.requested_bytes -= self._requests.pop(handle)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                del self._by_addr[neighbour.addr]
                if neighbour is block.prev:
                    # the neighbour is absorbed into `block`, which takes its (lower) address
                    del self._by_addr[block.addr]
                    block.addr = neighbour.addr
                    block.prev = neighbour.prev
                    if block.prev is not None:
                        block.prev.next = block
                    self._by_addr[block.addr] = block
                else:
                    block.next = neighbour.next
                    if block.next is not None:
                        block.next.prev = block
                block.size += neighbour.size
        self._add_free(block)


@dataclass(frozen=True)
class AllocatorReplay:
    """What replaying a list of events through :class:`CachingAllocatorModel` gave.

    The ``*_bytes`` lists hold the counters *after* each event, so ``max(allocated_bytes)`` is the
    peak and ``allocated_bytes.index(max(...))`` the event at which it happened.
    """

    requested_bytes: list[int]
    allocated_bytes: list[int]
    reserved_bytes: list[int]
    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_allocated_index: int
    segments: int
    largest_free_block_bytes: int


def replay_allocator(events: Iterable[tuple[str, int, int]]) -> AllocatorReplay:
    """Replay ``(action, key, nbytes)`` events, action ``"alloc"`` or ``"free"``.

    ``key`` names the tensor storage: an alloc opens it, the matching free closes it (its
    ``nbytes`` is ignored). A free of a key never allocated raises ``KeyError``.
    """
    model = CachingAllocatorModel()
    handles: dict[int, int | None] = {}
    req, alloc, res = [], [], []
    peak_i, peak = -1, -1
    for i, (action, key, nbytes) in enumerate(events):
        if action == "alloc":
            if key in handles:
                raise KeyError(f"storage {key} allocated twice without a free")
            handles[key] = model.malloc(int(nbytes))
        elif action == "free":
            model.free(handles.pop(key))
        else:
            raise BadArgument(f"unknown allocator action {action!r} (expected 'alloc' or 'free')")
        req.append(model.requested_bytes)
        alloc.append(model.allocated_bytes)
        res.append(model.reserved_bytes)
        if model.allocated_bytes > peak:
            peak, peak_i = model.allocated_bytes, i
    return AllocatorReplay(
        requested_bytes=req,
        allocated_bytes=alloc,
        reserved_bytes=res,
        peak_requested_bytes=model.peak_requested_bytes,
        peak_allocated_bytes=model.peak_allocated_bytes,
        peak_reserved_bytes=model.peak_reserved_bytes,
        peak_allocated_index=peak_i,
        segments=model.segment_count,
        largest_free_block_bytes=model.largest_free_block(),
    )
