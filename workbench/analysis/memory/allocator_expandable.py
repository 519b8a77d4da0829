"""``expandable_segments:True`` for the allocator model, and a replay under a memory cap.

With expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) the caching allocator
keeps one virtual address range per pool and maps physical pages into it as it grows: 20 MiB pages
(``LARGE_BUFFER``) for the large pool, 2 MiB (``SMALL_BUFFER``) for the small one. A request no cached
block can serve is placed at the end of the range: a free block already at the end is extended by the
pages that are missing, instead of a whole new segment being made beside it. Holes inside the range
stay mapped (as holes in segments do without it), but free memory at the end is always usable, which is
what makes a fragmentation OOM go away. :class:`ExpandableSegmentsModel` replays that with plain
integers; blocks are split and merged as in :class:`~workbench.analysis.memory.allocator_model.CachingAllocatorModel`.

:func:`replay_capped` replays ``(action, key, nbytes)`` events through either model under a cap, as
torch does under ``set_per_process_memory_fraction`` or a full device: when a new segment (or new pages)
would pass the cap, the cached free memory is released first (``empty_cache``, what torch does before it
raises) and the request retried; if it still does not fit, the replay stops there: an OOM.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

from workbench.analysis.memory.allocator_model import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    SMALL_BUFFER,
    SMALL_SIZE,
    CachingAllocatorModel,
    is_small,
    round_size,
)
from workbench.errors import BadArgument

__all__ = ["ExpandableSegmentsModel", "CappedReplay", "replay_capped"]


class ExpandableSegmentsModel:
    """The caching allocator with expandable segments: one growing range per pool.

    >>> m = ExpandableSegmentsModel()
    >>> a = m.malloc(30 << 20); m.reserved_bytes >> 20      # two 20 MiB pages
    40
    >>> b = m.malloc(30 << 20); m.reserved_bytes >> 20      # the 10 MiB left at the end + one page
    60
    """

    def __init__(self) -> None:
        # per pool (small?): blocks as [addr, size, allocated, unmapped bytes inside] sorted by address
        self._blocks: dict[bool, list[list]] = {True: [], False: []}
        self._end: dict[bool, int] = {True: 0, False: 0}
        self._handles: dict[int, tuple[bool, int]] = {}
        self._next = 1
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0

    @staticmethod
    def _page(small: bool) -> int:
        return SMALL_BUFFER if small else LARGE_BUFFER

    def _find(self, small: bool, size: int) -> int:
        best, bi = None, -1
        for i, b in enumerate(self._blocks[small]):
            if not b[2] and b[1] >= size and (best is None or b[1] < best):
                best, bi = b[1], i
        return bi

    def _remap(self, small: bool, block: list, size: int) -> int:
        """Bytes to map again when ``size`` bytes are taken from the start of a free block whose pages
        were released (``empty_cache``)."""
        page = self._page(small)
        return min(block[3], -(-size // page) * page)

    def would_grow(self, nbytes: int) -> int:
        """Bytes of pages ``malloc(nbytes)`` would map (0: a mapped free block serves it)."""
        if nbytes == 0:
            return 0
        size = round_size(nbytes)
        small = is_small(size)
        i = self._find(small, size)
        if i >= 0:
            return self._remap(small, self._blocks[small][i], size)
        blocks = self._blocks[small]
        page = self._page(small)
        if blocks and not blocks[-1][2]:
            tail = blocks[-1]
            return -(-(size - tail[1]) // page) * page + self._remap(small, tail, tail[1])
        return -(-size // page) * page

    def malloc(self, nbytes: int) -> int | None:
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = is_small(size)
        blocks = self._blocks[small]
        grow = self.would_grow(nbytes)
        i = self._find(small, size)
        if i < 0:
            page = self._page(small)
            if blocks and not blocks[-1][2]:
                new = -(-(size - blocks[-1][1]) // page) * page
                blocks[-1][1] += new
            else:
                new = -(-size // page) * page
                blocks.append([self._end[small], new, False, 0])
            self._end[small] += new
            i = len(blocks) - 1
        self.reserved_bytes += grow
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        addr, bsize, _, unmapped = blocks[i]
        taken = min(unmapped, grow) if unmapped else 0
        rest = bsize - size
        if rest >= (MIN_BLOCK_SIZE if small else SMALL_SIZE + 1):
            blocks[i] = [addr, size, True, 0]
            blocks.insert(i + 1, [addr + size, rest, False, max(unmapped - taken, 0)])
        else:
            blocks[i] = [addr, bsize, True, 0]
            size = bsize
        self.allocated_bytes += size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        h = self._next
        self._next += 1
        self._handles[h] = (small, addr)
        return h

    def free(self, handle: int | None) -> None:
        if handle is None:
            return
        small, addr = self._handles.pop(handle)
        blocks = self._blocks[small]
        i = bisect.bisect_left([b[0] for b in blocks], addr)
        b = blocks[i]
        b[2] = False
        self.allocated_bytes -= b[1]
        if i + 1 < len(blocks) and not blocks[i + 1][2]:
            nb = blocks.pop(i + 1)
            b[1] += nb[1]
            b[3] += nb[3]
        if i > 0 and not blocks[i - 1][2]:
            pb = blocks[i - 1]
            pb[1] += b[1]
            pb[3] += b[3]
            blocks.pop(i)

    def add_segment(self, nbytes: int) -> None:
        """Memory mapped before the replay begins, all of it free: a free range at the end of its pool
        (2 MiB: the small pool)."""
        size = int(nbytes)
        if size <= 0:
            return
        small = size == SMALL_BUFFER
        blocks = self._blocks[small]
        if blocks and not blocks[-1][2]:
            blocks[-1][1] += size
        else:
            blocks.append([self._end[small], size, False, 0])
        self._end[small] += size
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def empty_cache(self) -> int:
        """Unmap the whole pages inside free blocks (what torch releases); return the bytes released."""
        released = 0
        for small, blocks in self._blocks.items():
            page = self._page(small)
            for b in blocks:
                if not b[2]:
                    lo, hi = -(-b[0] // page) * page, (b[0] + b[1]) // page * page
                    free_pages = max(hi - lo, 0)
                    released += max(free_pages - b[3], 0)
                    b[3] = max(b[3], free_pages)
        self.reserved_bytes -= released
        return released


@dataclass(frozen=True)
class CappedReplay:
    """What :func:`replay_capped` gave: whether every event ran under the cap, the peaks (reserved:
    ``torch.cuda.max_memory_reserved``; allocated: ``max_memory_allocated``), and where it stopped."""

    fits: bool
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    oom_event: int | None  # index of the event that could not be served
    oom_label: str | None  # the label of that event, when the events carry one
    events: int


def replay_capped(events: Iterable[tuple], cap_bytes: int | None, expandable: bool = False,
                  max_split_size: int | None = None) -> CappedReplay:
    """Replay ``(action, key, nbytes[, label])`` events (action ``alloc``/``free``, or ``segment``: a free
    segment the process already holds when the replay begins) under ``cap_bytes`` (None: no cap). A new
    segment that would pass the cap first releases the cached free memory and retries; when that does not
    make room, the replay stops: an OOM at that event."""
    if expandable and max_split_size is not None:
        raise BadArgument("max_split_size has no effect with expandable segments")
    m = ExpandableSegmentsModel() if expandable else CachingAllocatorModel(max_split_size=max_split_size)
    handles: dict = {}
    n = 0
    for n, ev in enumerate(events):
        action, key, nbytes = ev[0], ev[1], ev[2]
        if action == "alloc":
            grow = m.would_grow(int(nbytes))
            if cap_bytes is not None and grow and m.reserved_bytes + grow > cap_bytes:
                # torch: with max_split_size, enough oversize cached blocks first; then every free segment
                if not (isinstance(m, CachingAllocatorModel) and m.release_oversize(int(nbytes))
                        and m.reserved_bytes + m.would_grow(int(nbytes)) <= cap_bytes):
                    m.empty_cache()
                grow = m.would_grow(int(nbytes))
                if m.reserved_bytes + grow > cap_bytes:
                    return CappedReplay(False, m.peak_reserved_bytes, m.peak_allocated_bytes, n,
                                        ev[3] if len(ev) > 3 else None, n + 1)
            handles[key] = m.malloc(int(nbytes))
        elif action == "free":
            m.free(handles.pop(key))
        elif action == "segment":  # reserved before the replay begins, free (counted against the cap)
            m.add_segment(int(nbytes))
        else:
            raise BadArgument(f"unknown allocator action {action!r} (expected 'alloc', 'free' or 'segment')")
    return CappedReplay(True, m.peak_reserved_bytes, m.peak_allocated_bytes, None, None, n + 1)
