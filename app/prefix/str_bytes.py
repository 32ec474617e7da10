"""A str's own bytes, read in place when it is ASCII: hashing and comparing long text without a copy.

XXH3 reads bytes, and `str.encode` copies them: a long line keyed from a prompt was sliced, then
encoded, two copies of a MB before the hash read it. Comparing two prefixes with `startswith`
copied one of them first (a slice). An ASCII str holds exactly its UTF-8 bytes, and CPython's
`PyUnicode_AsUTF8AndSize` returns a pointer to them without copying (for an ASCII str it allocates
nothing). So a stretch of one is hashed over a memoryview of that memory (~18 µs a MB against
~50 µs for the slice and the encode), and two are compared by one `memcmp` (~23 µs a MB against
~43 µs). The digest is of the same bytes either way, so a key does not depend on the path that
made it. Any other str is sliced (and encoded) as before.
"""

from __future__ import annotations

import ctypes

import xxhash

_PYBUF_READ = 0x100

_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_utf8.restype = ctypes.c_void_p
_utf8.argtypes = (ctypes.py_object, ctypes.c_void_p)
_view = ctypes.pythonapi.PyMemoryView_FromMemory  # one memoryview type for any length
_view.restype = ctypes.py_object
_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
try:
    # the C library the interpreter is linked with, called holding the GIL (PyDLL): CDLL would
    # release it for the ~23 µs of a MB, and the loop thread would then wait for a worker thread
    # to hand it back (up to the 5 ms switch interval)
    _memcmp = ctypes.PyDLL(None).memcmp
    _memcmp.restype = ctypes.c_int
    _memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
except (OSError, AttributeError):  # none found by name (a static build): compare slices instead
    _memcmp = None


def xxh3_128_utf8(text: str, start: int = 0, end: int | None = None) -> bytes:
    """XXH3-128 of `text[start:end]` as UTF-8 (lone surrogates passed through, as
    `encode("utf-8", "surrogatepass")` writes them); offsets are not negative."""
    stop = len(text) if end is None else min(end, len(text))
    start = min(start, stop)
    if text.isascii():
        # `text` stays referenced by this frame while the view is read: the memory is its own
        return xxhash.xxh3_128_digest(_view(_utf8(text, None) + start, stop - start, _PYBUF_READ))
    return xxhash.xxh3_128_digest(text[start:stop].encode("utf-8", "surrogatepass"))


def same_prefix(a: str, b: str, n: int) -> bool:
    """Whether `a` and `b` both hold at least `n` characters and share the first `n`."""
    if n > len(a) or n > len(b):
        return False
    if _memcmp is not None and a.isascii() and b.isascii():
        return _memcmp(_utf8(a, None), _utf8(b, None), n) == 0
    return a.startswith(b[:n])
