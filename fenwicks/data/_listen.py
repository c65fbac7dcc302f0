"""Where a tf.data service server listens: one address, not every interface.

TensorFlow's dispatcher and worker servers always listen on ``[::]:PORT`` (every
interface; `DispatcherConfig` has no address field). The service has no authentication,
so Fenwicks narrows that while a server starts: the ``bind`` calls TensorFlow's gRPC makes
from its own libraries are routed through `_narrow`, which turns a wildcard address into
the one asked for. The hook is swapped into those libraries' import slots (their GOT
entries for ``bind``) for the duration of the start only, and `listeners` then reads
``/proc/net/tcp*`` so a server that still listens wider is stopped, never used.

The slots are process-wide, so one start at a time: `LOCK` is held from the swap to the
check (`fenwicks.data.service` holds it around both). Two threads swapping at once
interleaved their ``mprotect`` calls (``PermissionError``), restored each other's freed
hook (a crash), and let one server bind before its narrowing was in place.

This is Linux-only (ELF, ``/proc``): elsewhere `narrowed` raises and the user chooses
``--bind 0.0.0.0`` knowingly.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import socket
import struct
import sys
import threading
from collections.abc import Iterator

import numpy as np

# libtensorflow_cc holds the data-service servers; libtensorflow_framework has its own
# copy of gRPC. Both import libc's bind, so both slots are switched.
_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")
_BIND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32,
                         use_errno=True)
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_DT_NULL, _DT_PLTRELSZ, _DT_STRTAB, _DT_SYMTAB, _DT_RELA, _DT_RELASZ, _DT_JMPREL = \
    0, 2, 5, 6, 7, 8, 23
_TCP_LISTEN = "0A"
# Held by whoever starts a server in this process, narrowed or not: while one thread's
# hook is in the slots, another thread's wildcard server would be narrowed by it too.
LOCK = threading.RLock()
_RELA = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("section", "<u2"),
                 ("value", "<u8"), ("size", "<u8")])


@functools.cache  # a process may start several servers
def _import_slots(path: str, name: bytes = b"bind") -> tuple[int, ...]:
    """Offsets (from the load address) of `path`'s GOT slots for the symbol `name`."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:  # 64-bit little-endian only
            raise OSError(f"{path} is not a 64-bit little-endian ELF library")
        phoff, = struct.unpack_from("<Q", m, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", m, 0x36)
        loads, dynamic = [], (0, 0)
        for i in range(phnum):
            kind, _, offset, vaddr, _, size, _, _ = struct.unpack_from(
                "<IIQQQQQQ", m, phoff + i * phentsize)
            if kind == 1:  # PT_LOAD
                loads.append((vaddr, offset, size))
            elif kind == 2:  # PT_DYNAMIC
                dynamic = (offset, size)

        def at(vaddr: int) -> int:
            return next(o + vaddr - v for v, o, s in loads if v <= vaddr < v + s)

        tags: dict[int, int] = {}
        for i in range(dynamic[1] // 16):
            tag, value = struct.unpack_from("<qQ", m, dynamic[0] + 16 * i)
            if tag == _DT_NULL:
                break
            tags.setdefault(tag, value)
        symtab, strtab = at(tags[_DT_SYMTAB]), at(tags[_DT_STRTAB])
        data = np.frombuffer(m, dtype=np.uint8)
        wanted = np.frombuffer(name + b"\0", dtype=np.uint8)
        found = []
        for table, size in ((_DT_JMPREL, _DT_PLTRELSZ), (_DT_RELA, _DT_RELASZ)):
            if not tags.get(table):
                continue
            # Elf64_Rela records, compared at once: libtensorflow_cc has ~10^6 of them
            relocations = np.frombuffer(m, dtype=_RELA, count=tags[size] // 24,
                                        offset=at(tags[table]))
            symbols = (relocations["info"] >> np.uint64(32)).astype(np.int64)
            names = np.frombuffer(m, dtype=_SYM, count=int(symbols.max()) + 1,
                                  offset=symtab)["name"].astype(np.int64)[symbols]
            starts = strtab + names
            same = symbols > 0
            for k, byte in enumerate(wanted):
                same &= data[np.minimum(starts + k, len(data) - 1)] == byte
            found.extend(int(o) for o in relocations["offset"][same])
            del relocations  # a view of the mapping: gone before it closes
        del data, wanted
    return tuple(found)


def _load_address(path: str) -> int:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == real and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    raise OSError(f"{path} is not loaded in this process")


def _narrow(address: str):
    """A C ``bind`` that puts `address` where a wildcard address was asked for."""
    target = socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET,
                              address)
    # An IPv4 address on gRPC's dual-stack IPv6 socket: the IPv4-mapped form.
    target6 = target if len(target) == 16 else b"\0" * 10 + b"\xff\xff" + target
    real: list = []

    def bind(fd: int, addr: int, length: int) -> int:
        raw = bytearray(ctypes.string_at(addr, length))
        family = int.from_bytes(raw[:2], sys.byteorder)
        if family == socket.AF_INET and raw[4:8] == b"\0" * 4:
            if len(target) != 4:  # an IPv6 address asked for: no IPv4 listener at all
                ctypes.set_errno(99)  # EADDRNOTAVAIL
                return -1
            raw[4:8] = target
        elif family == socket.AF_INET6 and raw[8:24] == b"\0" * 16:
            raw[8:24] = target6
        buffer = (ctypes.c_char * length).from_buffer(raw)
        return real[0](fd, buffer, length)

    return bind, real


@contextlib.contextmanager
def narrowed(address: str, tf_dir: str) -> Iterator[None]:
    """Within this block TensorFlow's servers listen on `address` instead of ``[::]``.

    Raises:
        OSError: on a system where this cannot be done (not Linux, no such library).
    """
    if not sys.platform.startswith("linux"):
        raise OSError(f"listening on {address} only is supported on Linux; here the "
                      "tf.data service can only listen on every interface (--bind 0.0.0.0, "
                      "behind a firewall)")
    with LOCK:
        yield from _narrowed(address, tf_dir)


def _narrowed(address: str, tf_dir: str) -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    hook, real = _narrow(address)
    pointer = _BIND(hook)
    switched = []
    try:
        for name in _LIBRARIES:
            path = os.path.join(tf_dir, name)
            if not os.path.exists(path):
                continue
            base = _load_address(path)
            for offset in _import_slots(path):
                switched.append((base + offset, _swap(libc, base + offset, pointer)))
        if not switched:
            raise OSError(f"no TensorFlow library in {tf_dir} to narrow the listen address")
        real.append(_BIND(switched[0][1]))  # every slot resolved to libc's one bind
        yield
    finally:
        for slot, old in switched:
            _swap(libc, slot, old)


def _swap(libc: ctypes.CDLL, slot: int, value) -> int:
    """Writes `value` (a pointer) into the GOT `slot`; returns the old one."""
    page = slot & ~(mmap.PAGESIZE - 1)
    was = _protection(page)
    if libc.mprotect(page, mmap.PAGESIZE, was | _PROT_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "cannot narrow the listen address (mprotect)")
    cell = ctypes.c_void_p.from_address(slot)
    old = cell.value
    cell.value = ctypes.cast(value, ctypes.c_void_p).value if not isinstance(value, int) \
        else value
    # As found: read-only after loading under RELRO, writable without it (the dynamic
    # linker may still write lazily bound slots on that page).
    libc.mprotect(page, mmap.PAGESIZE, was)
    return old


def _protection(address: int) -> int:
    """The PROT_* bits of the mapping holding `address` (from /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return (_PROT_READ if perms[0] == "r" else 0) | \
                    (_PROT_WRITE if perms[1] == "w" else 0) | (_PROT_EXEC if perms[2] == "x" else 0)
    raise OSError(f"address {address:#x} is not mapped")


def listeners(port: int, pid: int | str = "self") -> list[str]:
    """``'host:port'`` of every socket process `pid` listens with on TCP `port`."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            link = os.readlink(os.path.join(fd_dir, fd))
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                host, port_hex = fields[1].split(":")
                if fields[3] != _TCP_LISTEN or int(port_hex, 16) != port or \
                        fields[9] not in inodes:
                    continue
                # /proc prints each 32-bit word of the address in host byte order
                raw = b"".join(int(host[i:i + 8], 16).to_bytes(4, sys.byteorder)
                               for i in range(0, len(host), 8))
                text = socket.inet_ntop(family, raw)
                found.append(f"[{text}]:{port}" if family == socket.AF_INET6 else
                             f"{text}:{port}")
    return found
