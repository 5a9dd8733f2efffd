"""Freed memory kept for reuse: the C allocator's settings for the command line's processes.

A training step allocates and frees the same tensors at every step. glibc's ``malloc`` serves
a block above ``M_MMAP_THRESHOLD`` with a mapping of its own, unmapped when it is freed, and
gives the top of its heap back to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free;
both thresholds start low (128 KiB and 256 KiB) and follow the largest block freed so far
(``mallopt(3)``). Memory given back returns at the next step as new pages, each zeroed by the
kernel at its first touch: a minor page fault per 4 KiB. The demo's ``dpaudit run`` took 52.7
million of them, 102 s of system time out of 801 s of CPU time (``/usr/bin/time -v``, this
project's 2-core machine, 2026-12-05); with the settings below, 9.8 million and 37-38 s.

:func:`keep_freed_memory` raises the mmap threshold to the largest glibc accepts (32 MiB on a
64-bit machine) and the trim threshold to 2 GiB, in this process (``mallopt``) and, through
their environment variables, in the processes it starts (the fleet's workers). Blocks above
32 MiB are still mapped and unmapped. Nothing changes what is computed; the resident memory
stays near its peak instead of shrinking between steps. A variable the user has set wins.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt(3) parameters (malloc.h) and the environment variables glibc reads at a process's start
SETTINGS = {
    "MALLOC_TRIM_THRESHOLD_": (-1, 2**31 - 1),  # M_TRIM_THRESHOLD: mallopt takes an int
    "MALLOC_MMAP_THRESHOLD_": (-3, 32 * 2**20),  # M_MMAP_THRESHOLD: glibc's largest on 64-bit
}


def keep_freed_memory() -> dict[str, int]:
    """Set glibc's trim and mmap thresholds (module docstring) in this process and in the
    environment of the processes it starts; return the settings made, by environment
    variable. Nothing is set off Linux with glibc, for a variable the user has set, or when
    ``GLIBC_TUNABLES`` sets any of ``malloc``'s."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return {}
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return {}
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {}
    for variable, (parameter, value) in SETTINGS.items():
        if variable in os.environ or mallopt(parameter, value) != 1:
            continue
        os.environ[variable] = str(value)
        done[variable] = value
    return done
