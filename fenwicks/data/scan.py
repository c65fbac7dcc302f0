"""Checking TFRecord files before training: truncation, corruption, record counts.

TensorFlow reports a damaged file as "corrupted record at 480" - without the file name,
and only when training reaches it. Fenwicks walks each file once up front (a sequential
read, checking the CRC32C checksums of the TFRecord framing) so the error names the file
before any compile, and so ``skip_corrupt`` knows exactly how many records it drops.
Results are cached per (path, size, modification time).
"""

from __future__ import annotations

import dataclasses
import logging
import struct

import tensorflow as tf

logger = logging.getLogger("fenwicks")

_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_FOOTER = 4  # uint32 masked CRC of the data
_MAX_RECORD = 2**31  # a larger length means the header itself is garbage
_cache: dict[tuple[str, int, int], FileScan] = {}


@dataclasses.dataclass(frozen=True)
class FileScan:
    """What a walk through one TFRecord file found.

    Attributes:
        path: the file.
        records: readable records before the first problem (all of them if none).
        skipped: records lost at and after the problem (0 if none; a lower bound when
            the framing itself is damaged).
        problem: a description such as ``'corrupted record 4 at byte 480'``, or None.
        first_records: the first (up to two) good records' bytes, to check the parser.
    """

    path: str
    records: int
    skipped: int = 0
    problem: str | None = None
    first_records: tuple[bytes, ...] = ()


def _masked_crc(data: bytes, crc32c) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _crc_function():
    try:
        import google_crc32c  # a C extension, installed with google-cloud-storage / gcsfs
    except ImportError:
        logger.info("fenwicks: google-crc32c is not installed; TFRecord checks cover "
                    "framing and truncation but not checksums")
        return None
    return google_crc32c.value


def scan_tfrecord(path: str) -> FileScan:
    """Walks one TFRecord file; see `FileScan`. Cached while the file is unchanged.

    Examples:
        >>> with tf.io.TFRecordWriter('train.tfrec') as writer:
        ...     for record in [b'a', b'bc', b'def']:
        ...         writer.write(record)
        >>> scan = fw.data.scan_tfrecord('train.tfrec')
        >>> scan.records, scan.problem, scan.first_records
        (3, None, (b'a', b'bc'))
    """
    stat = tf.io.gfile.stat(path)
    key = (path, stat.length, stat.mtime_nsec)
    if key not in _cache:
        with tf.io.gfile.GFile(path, "rb") as f:
            _cache[key] = _walk(path, _Chunked(f), _crc_function())
    return _cache[key]


class _Chunked:
    """Sequential reads served from 8 MB chunks: one GFile call per chunk, not two per
    record (a call costs microseconds, and CIFAR has 50,000 records)."""

    def __init__(self, f, chunk: int = 8 << 20) -> None:
        self._f, self._chunk, self._buffer, self._pos = f, chunk, b"", 0

    def read(self, n: int) -> bytes:
        if self._pos + n > len(self._buffer):
            rest = self._buffer[self._pos:]
            self._buffer = rest + self._f.read(max(self._chunk, n - len(rest)))
            self._pos = 0
        out = self._buffer[self._pos:self._pos + n]
        self._pos += len(out)
        return out


def _walk(path: str, f: _Chunked, crc32c) -> FileScan:
    good, offset, first, problem = 0, 0, [], None
    while problem is None:
        header = f.read(_HEADER)
        if not header:
            break
        problem = _check_header(header, crc32c)
        if problem is None:
            length = struct.unpack("<Q", header[:8])[0]
            body = f.read(length + _FOOTER)
            problem = _check_body(body, length, crc32c)
        if problem is None:
            if len(first) < 2:
                first.append(body[:length])
            good, offset = good + 1, offset + _HEADER + length + _FOOTER
    if problem is None:
        return FileScan(path, good, first_records=tuple(first))
    skipped = 1 + (_count_rest(f) if problem.startswith("corrupted data") else 0)
    return FileScan(path, good, skipped, f"{problem} in record {good} at byte {offset}",
                    tuple(first))


def _check_header(header: bytes, crc32c) -> str | None:
    if len(header) < _HEADER:
        return "truncated header"
    length = struct.unpack("<Q", header[:8])[0]
    if crc32c is not None and struct.unpack("<I", header[8:])[0] != _masked_crc(header[:8],
                                                                              crc32c):
        return "corrupted length"
    return "corrupted length" if length >= _MAX_RECORD else None


def _check_body(body: bytes, length: int, crc32c) -> str | None:
    if len(body) < length + _FOOTER:
        return "truncated data"
    if crc32c is not None and struct.unpack("<I", body[length:])[0] != _masked_crc(
            body[:length], crc32c):
        return "corrupted data"
    return None


def _count_rest(f: _Chunked) -> int:
    """Records after a bad checksum: TensorFlow's reader stops at it, so they are lost too."""
    count = 0
    while len(header := f.read(_HEADER)) == _HEADER:
        length = struct.unpack("<Q", header[:8])[0]
        if length >= _MAX_RECORD or len(f.read(length + _FOOTER)) < length + _FOOTER:
            break
        count += 1
    return count
