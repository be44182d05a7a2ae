"""glibc's malloc settings for training processes (fedpers.core.allocator): who chooses them, and that
retained memory is reused instead of faulted in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fedpers.core.allocator import allocator_choice
from fedpers.core.errors import ConfigError

# A fresh process allocates, touches and frees a 64 MiB tensor again and again (a training step's largest
# buffers live like this) and reports the minor page faults of 9 rounds after 20 of warm-up: torch asks for
# 64-byte aligned blocks, which glibc's heap fits only once a few freed ones have merged.
CHILD = r"""
import json, resource, torch
from fedpers.core.allocator import retain_freed_memory
changed = retain_freed_memory()
for _ in range(20):
    torch.ones(16 * 2**20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(9):
    torch.ones(16 * 2**20)
print(json.dumps({"changed": changed, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _child(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    base.pop("FEDPERS_MALLOC", None)
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                         env={**base, **env})
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_choice_is_ours_unless_the_user_made_one():
    assert allocator_choice({}) == "retain"
    assert allocator_choice({"FEDPERS_MALLOC": "retain"}) == "retain"
    assert allocator_choice({"FEDPERS_MALLOC": " System "}) == "system"
    assert allocator_choice({"MALLOC_TRIM_THRESHOLD_": "0"}) == "user"  # glibc's own variable: the user chose
    assert allocator_choice({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}) == "user"
    assert allocator_choice({"FEDPERS_MALLOC": "system", "MALLOC_MMAP_MAX_": "0"}) == "system"
    with pytest.raises(ConfigError) as info:
        allocator_choice({"FEDPERS_MALLOC": "jemalloc"})
    assert str(info.value) == ("environment variable FEDPERS_MALLOC='jemalloc': expected 'retain' (the default) or "
                               "'system' (glibc's own malloc settings)")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="glibc's malloc only")
def test_retained_memory_is_reused_and_glibcs_defaults_fault_it_in_every_time():
    ours, system, user = _child(), _child(FEDPERS_MALLOC="system"), _child(MALLOC_MMAP_THRESHOLD_="131072")
    pages = 9 * 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")  # every page of every allocation, faulted in again
    assert ours["changed"] is True and ours["faults"] < pages // 100
    assert system["changed"] is False and system["faults"] >= pages * 0.9
    assert user["changed"] is False and user["faults"] >= pages * 0.9  # the user's setting is kept
