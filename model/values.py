"""How a declared input's value is written as bytes: the text every path hashes, parses and
sends, so that a value means the same to `score`, training, a producer and the worker.

Pure Python with no imports beyond the standard library: a producer (worker/common) reads it
without loading the kernels.
"""

from __future__ import annotations


def value_bytes(v: object) -> bytes:
    """A value's bytes for hashing, and as a stream entry carries it: bytes as given, text as
    UTF-8, numbers as their text (an integer id hashes as its digits, so 12345, 12345.0 and
    "12345" share a bucket), None as b"" (absent)."""
    if v is None:
        return b""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, float) and v.is_integer():
        return str(int(v)).encode()
    return str(v).encode("utf-8", "surrogatepass")
