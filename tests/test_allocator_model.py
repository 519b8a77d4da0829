"""The caching-allocator model, with integers (rules of c10/cuda/CUDACachingAllocator.cpp)."""

from __future__ import annotations

import pytest

from workbench.analysis.memory.allocator_model import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocatorModel,
    allocation_size,
    replay_allocator,
    round_size,
)

MiB = 1 << 20


def test_round_size():
    assert round_size(1) == 512
    assert round_size(511) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(10 * MiB + 1) == 10 * MiB + 512


def test_segment_sizes_per_pool():
    assert allocation_size(512) == SMALL_BUFFER == 2 * MiB
    assert allocation_size(MiB) == 2 * MiB  # 1 MiB is still "small"
    assert allocation_size(MiB + 512) == LARGE_BUFFER == 20 * MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB  # from kMinLargeAlloc on: rounded to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_one_2mib_segment():
    m = CachingAllocatorModel()
    hs = [m.malloc(1000) for _ in range(2048)]  # 2048 x 1024 B = 2 MiB exactly
    assert m.reserved_bytes == 2 * MiB and m.segment_count == 1
    assert m.allocated_bytes == 2048 * 1024
    m.malloc(1)
    assert m.segment_count == 2 and m.reserved_bytes == 4 * MiB
    for h in hs:
        m.free(h)
    assert m.allocated_bytes == 512
    # everything freed in the first segment coalesced back into one 2 MiB block
    assert m.largest_free_block() == 2 * MiB


def test_large_pool_split_rule_needs_more_than_1mib_left():
    m = CachingAllocatorModel()
    a = m.malloc(2 * MiB)  # new 20 MiB segment, split: 18 MiB remain
    assert m.reserved_bytes == 20 * MiB and m.allocated_bytes == 2 * MiB
    b = m.malloc(17 * MiB + 512)  # fits the 18 MiB block; 1 MiB - 512 B would remain: no split
    assert m.reserved_bytes == 20 * MiB
    assert m.allocated_bytes == 2 * MiB + 18 * MiB  # the whole block counts as allocated
    m.free(b)
    m.free(a)
    assert m.allocated_bytes == 0 and m.largest_free_block() == 20 * MiB


def test_best_fit_takes_the_smallest_block_that_fits():
    m = CachingAllocatorModel()
    big = m.malloc(12 * MiB)  # own 12 MiB segment
    mid = m.malloc(2 * MiB)  # 20 MiB segment, 18 MiB left free
    m.free(big)  # free blocks: 12 MiB and 18 MiB (+2 MiB when mid goes)
    h = m.malloc(11 * MiB)
    assert m.reserved_bytes == 32 * MiB  # no new segment
    # the 12 MiB block was chosen (1 MiB left is not > 1 MiB: no split, whole 12 MiB allocated)
    assert m.allocated_bytes == 2 * MiB + 12 * MiB
    m.free(h)
    m.free(mid)


def test_reuse_after_free_needs_no_new_segment_and_reserved_never_shrinks():
    r = replay_allocator([("alloc", 1, 50 * MiB), ("free", 1, 0), ("alloc", 2, 30 * MiB), ("alloc", 3, 30 * MiB)])
    assert r.reserved_bytes == [50 * MiB, 50 * MiB, 50 * MiB, 80 * MiB]
    assert r.allocated_bytes == [50 * MiB, 0, 30 * MiB, 60 * MiB]
    assert r.peak_allocated_bytes == 60 * MiB and r.peak_allocated_index == 3


def test_zero_byte_requests_take_nothing_and_bad_events_raise():
    r = replay_allocator([("alloc", 1, 0), ("free", 1, 0)])
    assert r.peak_allocated_bytes == 0 and r.peak_reserved_bytes == 0
    with pytest.raises(KeyError):
        replay_allocator([("free", 7, 0)])
    with pytest.raises(ValueError):
        replay_allocator([("resize", 1, 10)])


def test_coalescing_merges_both_neighbours():
    m = CachingAllocatorModel()
    a, b, c = m.malloc(4 * MiB), m.malloc(4 * MiB), m.malloc(4 * MiB)  # one 20 MiB segment
    assert m.segment_count == 1
    m.free(a)
    m.free(c)  # c merges with the 8 MiB tail
    m.free(b)  # b merges with both
    assert m.largest_free_block() == 20 * MiB
    d = m.malloc(19 * MiB)
    assert m.segment_count == 1 and m.allocated_bytes == 20 * MiB  # 1 MiB left: not split
    m.free(d)


def test_empty_cache_releases_whole_free_segments_only():
    """The lesson-36 pattern: a cached 512 MiB block carved into 8 MiB pieces, every other one freed,
    plus four whole free 64 MiB segments. empty_cache returns the four, the holes stay."""
    m = CachingAllocatorModel()
    m.free(m.malloc(512 * MiB))
    pieces = [m.malloc(8 * MiB) for _ in range(64)]
    assert m.segment_count == 1 and m.reserved_bytes == 512 * MiB  # all 64 carved from the cached block
    for h in pieces[::2]:
        m.free(h)
    for h in [m.malloc(64 * MiB) for _ in range(4)]:  # no 64 MiB hole: four new segments
        m.free(h)
    assert m.reserved_bytes == 768 * MiB and m.largest_free_block() == 64 * MiB
    assert m.empty_cache() == 256 * MiB
    assert m.reserved_bytes == 512 * MiB and m.allocated_bytes == 256 * MiB
    assert m.free_in_reserved_bytes == 256 * MiB and m.largest_free_block() == 8 * MiB
    assert m.segment_count == 1
    assert m.empty_cache() == 0  # nothing more to give back while one piece is live
    h = m.malloc(8 * MiB)  # a hole is reused, no new segment
    assert m.reserved_bytes == 512 * MiB
    m.free(h)
    for p in pieces[1::2]:
        m.free(p)
    assert m.empty_cache() == 512 * MiB and m.reserved_bytes == 0 and m.segment_count == 0
    assert m.malloc(MiB) is not None and m.reserved_bytes == 2 * MiB  # usable after a full release


def test_empty_cache_small_pool():
    m = CachingAllocatorModel()
    a, b = m.malloc(1000), m.malloc(1000)
    m.free(a)
    assert m.empty_cache() == 0  # b keeps its 2 MiB segment
    m.free(b)
    assert m.empty_cache() == SMALL_BUFFER and m.reserved_bytes == 0
