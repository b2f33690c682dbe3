"""Keep freed host memory in the process that runs the model, so a step does not
page-fault its activations in afresh.

On the CPU, torch allocates every tensor with the C library's ``malloc`` and has no
caching allocator (CUDA has one; the CPU path does not). glibc serves any allocation
above its mmap threshold (128 KiB to start, adjusted up to at most 32 MiB) with a fresh
``mmap`` and hands it back on ``free``. A prefill step's scores and MLP activations are
tens of MiB each, so every such step faulted its pages in anew: measured on the tiny
model, a 1024-token prefill took 66k minor page faults (~260 MB zeroed by the kernel) and
215 ms; keeping freed memory in the heap took it to 0 faults and 110 ms, a 512-token
prefill with 16 decodes from 60 to 40 ms, while decode-only steps were unchanged. It
also removed a warm-up drift: the same prefill ran ~2x slower the first time than
a minute later, while glibc's dynamic threshold caught up.

``retain_freed_host_memory`` fixes the mmap threshold at 1 GiB (so only allocations
larger than that, such as a big KV pool, still get their own mapping) and the trim
threshold at 2 GiB (so the heap is not handed back between steps), and allows a
single malloc arena, so memory freed by any thread of the process is there for the
next step's (glibc's default gives threads arenas of their own, up to 8 per core,
and a heap's freed blocks serve only its own arena's threads). With this and
``ModelRunner.warm_up``'s two rounds, 1 of 34 fresh processes on a loaded machine grew
its heap in the first real prefill (846 faults), 1 in 12 on a quiet one, and in one CI
run two of three did (by ~28 MiB, a quarter of a cold process's growth); with one round
and the default arenas, 1 in 16 idle and about 1 in 4 loaded did (up to 7,800
faults). Freed blocks are then reused once the heap has grown to the steps' working
set: the first few steps of a new shape still fault, later ones do not. The cost is
that the process keeps its peak step memory resident, which is what a caching
allocator does (and what PyTorch's CUDA allocator does on the device). Only glibc has
these knobs; on any other C library this is a no-op that says so once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger("schedscope.engine")

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD_BYTES = 1 << 30
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # mallopt takes a C int: 2 GiB less one byte

_applied: bool | None = None  # None: not tried yet in this process


def retain_freed_host_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once); return whether
    they are in effect. Idempotent and safe to call from every model runner."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("host memory: not glibc; freed activations go back to the system each step")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as error:  # a glibc without mallopt: keep defaults
        log.info("host memory: mallopt unavailable (%s); keeping malloc's defaults", error)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    trim_ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    arena_ok = mallopt(_M_ARENA_MAX, 1) == 1
    _applied = mmap_ok and trim_ok and arena_ok
    if not _applied:
        log.warning(
            "host memory: glibc refused the settings (mmap %s, trim %s, one arena %s)",
            mmap_ok,
            trim_ok,
            arena_ok,
        )
    return _applied
