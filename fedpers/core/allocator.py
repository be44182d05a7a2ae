"""glibc's malloc kept from handing a training step's buffers back to the kernel after every step.

A CPU training step allocates its activations and gradients (tens of MiB each for a convolution over
64x64 or 112x112 images), frees them, and allocates them again in the next step. With glibc's defaults the
largest are served by ``mmap`` and returned by ``munmap`` on free, freed memory at the top of the heap is
trimmed back to the kernel, and a thread's arena (the in-process engine trains in a worker thread) deletes a
64 MiB heap as soon as it is free: every step faults the same pages in again, tens of thousands of minor
page faults per step of a GroupNorm CNN on this project's CPU machine (``benchmarks/allocator.py``,
``benchmarks/results/allocator.md``). Here every block comes from a heap (``M_MMAP_MAX`` 0), the main heap
is trimmed only past 1 GiB of free memory (``M_TRIM_THRESHOLD``), and 64 MiB of padding (``M_TOP_PAD``,
address space reserved, not touched) keeps a thread's free heaps alive, so the next step reuses the same
pages. The price is memory held: the peak resident memory of the benchmark's whole PACS runs was about a
tenth higher at 64x64 and a fifth at 112x112 (torch asks for 64-byte aligned blocks, which a heap reuses
only once freed neighbours have merged, and retained heaps stay with the process).

Linux with glibc only; elsewhere (musl on an edge device, macOS) nothing changes. A user who sets glibc's own
malloc variables (``MALLOC_MMAP_MAX_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``, ``GLIBC_TUNABLES``) keeps them, and ``FEDPERS_MALLOC=system`` leaves glibc's defaults as
they are.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

from fedpers.core.errors import ConfigError

OPT_OUT_ENV = "FEDPERS_MALLOC"
# mallopt(3) parameters, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 1 << 30
# glibc deletes a thread arena's free heap unless the padding covers a whole heap (64 MiB on 64-bit)
TOP_PAD_BYTES = 64 << 20
_GLIBC_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                   "GLIBC_TUNABLES")


def allocator_choice(environ=os.environ) -> str:
    """Whose malloc settings this process should run with: ``system`` (``FEDPERS_MALLOC=system``),
    ``user`` (glibc's own variables are set: the user chose) or ``retain`` (ours)."""
    value = environ.get(OPT_OUT_ENV, "").strip().lower()
    if value not in ("", "retain", "system"):
        raise ConfigError(f"environment variable {OPT_OUT_ENV}={environ[OPT_OUT_ENV]!r}: expected 'retain' (the "
                          "default) or 'system' (glibc's own malloc settings)")
    if value == "system":
        return "system"
    if any(name in environ for name in _GLIBC_SETTINGS):
        return "user"
    return "retain"


@functools.lru_cache(maxsize=1)
def retain_freed_memory() -> bool:
    """Serve every block from glibc's heaps (``M_MMAP_MAX`` 0), trim the main heap only past 1 GiB of free
    memory (``M_TRIM_THRESHOLD``) and keep free thread heaps (``M_TOP_PAD`` 64 MiB), once per process; True
    when this call changed glibc's settings.

    Takes effect for the allocations that follow it, so the entry points call it before a client trains."""
    if not sys.platform.startswith("linux") or allocator_choice() != "retain":
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's mallopt is a stub
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES), (M_TOP_PAD, TOP_PAD_BYTES))
    return all([bool(mallopt(param, value)) for param, value in settings])
