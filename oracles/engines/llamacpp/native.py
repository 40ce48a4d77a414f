"""Loading libllama from the ``llama-cpp-py-sync`` wheel, on a C library older than the one it was linked on.

The wheel (``llama-cpp-py-sync==0.11739``, tagged ``manylinux2014_x86_64``) links its shared libraries
against glibc 2.38: ``__isoc23_strtol``, ``__isoc23_strtoul``, ``__isoc23_strtoull`` and
``__isoc23_sscanf`` at version ``GLIBC_2.38``, the C23 variants (they also read a ``0b`` prefix) that
glibc 2.38 added. On an older glibc (Debian 12 has 2.36) ``dlopen`` fails with
``version `GLIBC_2.38' not found``. Every other symbol the libraries need is older than 2.36.

Where that happens (:func:`load_library`), the libraries are copied once into
``$ORACLES_HOME/tools/llama-cpp-py-sync-<version>-glibc<found>/`` and each copy's ELF dynamic tables are
patched (:func:`patch_isoc23`): each ``__isoc23_NAME`` an undefined symbol's name points at its own
suffix ``NAME`` (the classic ``strtol`` / ``sscanf``, at ``GLIBC_2.2.5``), and the ``GLIBC_2.38``
version requirement is rewritten to ``GLIBC_2.2.5``. The one behaviour given up is C23's ``0b`` prefix,
which llama.cpp's number parsing does not use. The patch is recorded in the engine's ``describe()``.
On glibc >= 2.38 the wheel's own files are loaded as they are.

The binding's CFFI declarations (``llama_cpp_py_sync._cffi_bindings.ffi``) are used as they are; only
the file they are opened on differs. Imported by the engine when it is built, never at collection.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracles.errors import OracleError

#: The glibc version the wheel's libraries require (their newest symbol version).
NEEDED_GLIBC = (2, 38)
#: The C23 symbols that require it, each redirected to the classic function of the same suffix.
ISOC23 = ("__isoc23_strtol", "__isoc23_strtoul", "__isoc23_strtoull", "__isoc23_sscanf")
_SHT_DYNSYM, _SHT_VERNEED, _SHT_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF


@dataclass(frozen=True)
class Loaded:
    """The opened library: ``lib`` (the CFFI library object), ``ffi``, the file opened and the patch
    applied (None: the wheel's file as it is)."""

    lib: Any
    ffi: Any
    path: Path
    patch: str | None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, None on another C library."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    if not found.startswith("glibc "):
        return None
    major, _, minor = found.split()[1].partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def elf_hash(name: bytes) -> int:
    """The SysV ELF hash of ``name`` (what ``vna_hash`` holds for a version name)."""
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _sections(data: bytes | bytearray) -> list[tuple[int, int, int, int]]:
    """(type, offset, size, link) of every section header of a little-endian ELF64 file."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(shnum):
        _name, kind, _flags, _addr, off, size, link = struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize)
        out.append((kind, off, size, link))
    return out


def _cstr(data: bytes | bytearray, at: int) -> bytes:
    return bytes(data[at:data.index(b"\0", at)])


def patch_isoc23(path: Path) -> list[str]:
    """Patch the ELF64 file ``path`` in place (module docstring); returns the symbols redirected
    (empty: the file needs nothing).

    Raises:
        OracleError: not a little-endian ELF64 file, or a symbol at ``GLIBC_2.38`` other than
            :data:`ISOC23`, or no ``GLIBC_2.2.5`` requirement to reuse (file and field named).
    """
    data = bytearray(path.read_bytes())
    if data[:6] != b"\x7fELF\x02\x01":
        raise OracleError(f"{path}: not a little-endian ELF64 shared library")
    secs = _sections(data)
    dynsym = next(s for s in secs if s[0] == _SHT_DYNSYM)
    versym = next((s for s in secs if s[0] == _SHT_VERSYM), None)
    verneed = next((s for s in secs if s[0] == _SHT_VERNEED), None)
    if versym is None or verneed is None:
        return []
    dynstr = secs[dynsym[3]][1]
    aux = _vernaux(data, verneed[1], dynstr)
    new = [a for a in aux if a[1] == b"GLIBC_2.38"]
    old = next((a for a in aux if a[1] == b"GLIBC_2.2.5"), None)
    if not new:
        return []
    if old is None:
        raise OracleError(f"{path}: field '.gnu.version_r' has no GLIBC_2.2.5 requirement to redirect GLIBC_2.38 to")
    redirected = _rename_symbols(data, path, dynsym, versym[1], dynstr, {a[2] for a in new})
    for at, _name, _other, _str in new:
        struct.pack_into("<I", data, at, elf_hash(b"GLIBC_2.2.5"))
        struct.pack_into("<I", data, at + 8, old[3])
    path.write_bytes(bytes(data))
    return redirected


def _vernaux(data: bytearray, off: int, dynstr: int) -> list[tuple[int, bytes, int, int]]:
    """(offset of the entry, version name, ``vna_other`` index, ``vna_name``) of every version requirement."""
    out = []
    while True:
        _version, count, _file, aux_off, next_off = struct.unpack_from("<HHIII", data, off)
        at = off + aux_off
        for _ in range(count):
            _hash, _flags, other, name, aux_next = struct.unpack_from("<IHHII", data, at)
            out.append((at, _cstr(data, dynstr + name), other, name))
            at += aux_next
        if not next_off:
            return out
        off += next_off


def _rename_symbols(data: bytearray, path: Path, dynsym: tuple[int, int, int, int], versym: int, dynstr: int,
                    indices: set[int]) -> list[str]:
    """Point each undefined ``__isoc23_NAME`` symbol at version ``indices`` to the string ``NAME``
    (its own suffix in ``.dynstr``; undefined symbols are not in the GNU hash table)."""
    done = []
    for i in range(dynsym[2] // 24):
        entry = dynsym[1] + 24 * i
        name_off, = struct.unpack_from("<I", data, entry)
        index, = struct.unpack_from("<H", data, versym + 2 * i)
        if index & 0x7FFF not in indices:
            continue
        name = _cstr(data, dynstr + name_off).decode()
        if name not in ISOC23:
            raise OracleError(f"{path}: symbol {name!r} needs GLIBC_2.38 and has no older equivalent here")
        struct.pack_into("<I", data, entry, name_off + len("__isoc23_"))
        done.append(name)
    return done


def _package_dir() -> Path:
    import llama_cpp_py_sync

    return Path(llama_cpp_py_sync.__file__).parent


def _patched_copy(src: Path, version: str, glibc: tuple[int, int]) -> tuple[Path, str]:
    """The folder of patched copies of ``src``'s libraries (built once, renamed into place), and the
    patch's one-line description."""
    from oracles.pins.pin import oracles_home

    files = sorted(p for p in src.iterdir() if p.is_file() and ".so" in p.name)
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes()[:65536] for p in files)).hexdigest()[:12]
    dest = oracles_home() / "tools" / f"llama-cpp-py-sync-{version}-glibc{glibc[0]}.{glibc[1]}-{digest}"
    note = (f"libraries copied to {dest} with {', '.join(ISOC23)} redirected from GLIBC_2.38 to their "
            f"GLIBC_2.2.5 equivalents (glibc here is {glibc[0]}.{glibc[1]})")
    if (dest / "libllama.so").is_file():
        return dest, note
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for p in files:
            shutil.copy2(p, tmp / p.name)
            patch_isoc23(tmp / p.name)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest, note


def load_library() -> Loaded:
    """Open the wheel's ``libllama.so`` with the binding's CFFI declarations (a patched copy on glibc
    older than 2.38: module docstring) and initialise its backend.

    Raises:
        OracleError: the library cannot be opened (the loader's message, file named).
    """
    import importlib.metadata

    from llama_cpp_py_sync._cffi_bindings import ffi

    folder, note = _package_dir(), None
    glibc = glibc_version()
    if glibc is not None and glibc < NEEDED_GLIBC:
        folder, note = _patched_copy(folder, importlib.metadata.version("llama-cpp-py-sync"), glibc)
    path = folder / "libllama.so"
    try:
        lib = ffi.dlopen(str(path))
    except OSError as exc:
        raise OracleError(f"{path}: cannot be opened: {exc}") from None
    lib.llama_backend_init()
    return Loaded(lib=lib, ffi=ffi, path=path, patch=note)
