"""Compile-only reports on CuTe DSL kernels: registers, spills and SASS.

The projection kernel only pays off if the machine code is what we meant:
wgmma (``HGMMA``) for the math, TMA (``UTMALDG``) for the weight stream, and
no local-memory traffic (``LDL``/``STL``: register spills). All of that can be
checked without a GPU: the DSL compiles for ``sm_90a`` on any machine, and the
``nvdisasm`` binary from the ``nvidia-cuda-nvdisasm`` wheel turns the cubin
into SASS. CI uses this to pin every tactic's code.

Getting the cubin (CuTe DSL 4.8.1):

- Preferred: compile with ``keep_cubin_options(dump_dir)``
  (``--keep-cubin --dump-dir=DIR``). The DSL writes
  ``DIR/<function>.<arch>.cubin`` and reads it back into ``compiled.__cubin__``
  right after compiling, so the directory may be deleted afterwards. The
  directory must exist: otherwise nothing is written and ``__cubin__`` is the
  path of a missing file, silently.
- ``--keep-sass`` is not used: when the compile target differs from the local
  GPU (any compile on a GPU-less machine) the DSL never runs nvdisasm and
  ``__sass__`` names a file that does not exist. We disassemble ourselves.
- Fallback for functions compiled without those options (a code-only cache,
  say): the compiled host module embeds the device code as a fatbinary in an
  ``llvm.mlir.global``; we take the uncompressed ELF image out of it.

Registers and the local-memory frame come from the cubin's ``.nv.info``
attributes (what ``cuobjdump --dump-resource-usage`` reports), static shared
memory from the size of ``.nv.shared.<kernel>``. CuTe DSL kernels take their
shared memory dynamically at launch; the static part is 0 or, when the dynamic
buffer is aligned to 1024 bytes, 1024 bytes of padding that still counts
against the per-CTA limit.
"""

from __future__ import annotations

import collections
import functools
import importlib.metadata
import os
import re
import struct
import subprocess
from dataclasses import dataclass

# Magic numbers of the containers we read.
_ELF_MAGIC = b"\x7fELF"
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_FATBIN_ELF_ENTRY = 2  # fatbinary entry kinds: 1 = PTX, 2 = ELF (cubin)

# .nv.info attribute records: a format byte, an attribute byte, then either a
# 16-bit size and that many bytes (format 0x04) or a 16-bit inline value.
_NVINFO_SIZED = 0x04
_EIATTR_FRAME_SIZE = 0x11  # per-thread local-memory frame, spills included
_EIATTR_REGCOUNT = 0x2F

_STO_CUDA_ENTRY = 0x10  # st_other bit marking a kernel entry point
_STT_FUNC = 2

# One SASS instruction line: "/*0abc*/  @!P0 OPCODE.MODIFIERS operands ;".
_INSTRUCTION = re.compile(
    r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", re.MULTILINE
)
_TARGET = re.compile(r"^\s*\.target\s+(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class KernelReport:
    """Resource use and key instruction counts of one compiled kernel."""

    kernel: str  # entry symbol in the cubin
    arch: str  # e.g. "sm_90a", as nvdisasm reads the cubin
    registers: int  # per thread
    static_shared_bytes: int  # excludes the dynamic shared memory set at launch
    local_bytes: int  # per-thread local-memory frame (where spills go)
    hgmma: int  # wgmma instructions
    warpgroup_arrives: int  # WARPGROUP.ARRIVE: one per batch of wgmmas issued together
    utmaldg: int  # TMA tensor loads
    ldl: int  # local-memory loads (spill reloads)
    stl: int  # local-memory stores (spills)
    sass: str  # nvdisasm -c output for this kernel

    @property
    def spills(self) -> int:
        """Local-memory instructions; zero for a kernel that fits in registers."""
        return self.ldl + self.stl

    @property
    def wgmma_serialized(self) -> bool:
        """Whether ptxas waits for each wgmma before issuing the next (its warning C7514): one arrive per wgmma."""
        return self.hgmma > 1 and self.warpgroup_arrives >= self.hgmma


@functools.cache
def nvdisasm_path() -> str:
    """The ``nvdisasm`` binary shipped by the ``nvidia-cuda-nvdisasm`` wheel."""
    # Located through the package's file list, not PATH or a guessed folder:
    # the wheel nests it under a CUDA-major folder (nvidia/cu13/bin today).
    try:
        files = importlib.metadata.distribution("nvidia-cuda-nvdisasm").files or ()
    except importlib.metadata.PackageNotFoundError as error:
        raise RuntimeError(
            "SASS reports need nvdisasm from the nvidia-cuda-nvdisasm package: "
            "pip install 'decode-projection[reports]'"
        ) from error
    for file in files:
        if file.name == "nvdisasm" and file.parent.name == "bin":
            path = str(file.locate())
            if os.access(path, os.X_OK):
                return path
    raise RuntimeError("nvidia-cuda-nvdisasm is installed but ships no nvdisasm binary")


def keep_cubin_options(dump_dir: str | os.PathLike, arch: str = "sm_90a") -> str:
    """``cute.compile`` options that target ``arch`` and keep the cubin in ``dump_dir``."""
    path = os.fspath(dump_dir)
    # The options are one whitespace-separated string; a path with blanks
    # would be cut into stray options.
    if any(blank in path for blank in " \t\n"):
        raise ValueError(f"dump directory {path!r} must not contain whitespace")
    # The DSL writes nothing, and says nothing, when the directory is missing.
    os.makedirs(path, exist_ok=True)
    return f"--gpu-arch={arch} --keep-cubin --dump-dir={path}"


def kernel_cubin(compiled) -> bytes:
    """The cubin (ELF) of a CuTe DSL compiled function."""
    kept = getattr(compiled, "__cubin__", None)
    # With --keep-cubin the DSL has read the file back as bytes; otherwise the
    # attribute is None or the path of a file that was never written.
    if isinstance(kept, bytes) and kept.startswith(_ELF_MAGIC):
        return kept
    module = getattr(compiled, "ir_module", None)
    object_file = getattr(compiled, "object_file", None)
    if module is not None:
        blobs = _module_fatbins(module)
    elif object_file is not None:
        # Loaded from the disk cache: the object file embeds the fatbinary.
        data = open(object_file, "rb").read()
        blobs = [data[data.index(_FATBIN_MAGIC):]] if _FATBIN_MAGIC in data else []
    else:
        raise ValueError(
            f"{type(compiled).__name__} holds neither a kept cubin, an IR module "
            f"nor an object file; compile with keep_cubin_options(...)"
        )
    images = [image for blob in blobs for image in _fatbin_elves(blob)]
    if len(images) != 1:
        raise ValueError(
            f"expected one uncompressed cubin in the compiled module, found "
            f"{len(images)}; compile with keep_cubin_options(...)"
        )
    return images[0]


def _module_fatbins(module) -> list[bytes]:
    """Byte strings of the module's globals that hold a fatbinary."""
    from cutlass._mlir import ir

    found = []

    def visit(op):
        if op.name == "llvm.mlir.global" and "value" in op.attributes:
            try:
                data = ir.StringAttr(op.attributes["value"]).value_bytes
            except (TypeError, ValueError):  # a numeric or aggregate initializer
                data = b""
            if data.startswith(_FATBIN_MAGIC):
                found.append(data)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _fatbin_elves(blob: bytes) -> list[bytes]:
    """The uncompressed ELF entries of one fatbinary."""
    _, _, header_size, fat_size = struct.unpack_from("<IHHQ", blob, 0)
    elves, offset, end = [], header_size, header_size + fat_size
    while offset + 16 <= min(end, len(blob)):
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", blob, offset)
        start = offset + entry_header
        image = blob[start : start + payload]
        # A compressed entry does not start with the ELF magic; skip it, and
        # let the caller ask for --keep-cubin instead of decompressing here.
        if kind == _FATBIN_ELF_ENTRY and image.startswith(_ELF_MAGIC):
            elves.append(image)
        offset = start + payload
    return elves


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


def _sections(elf: bytes) -> list[_Section]:
    """Section headers of a little-endian 64-bit ELF image."""
    if not elf.startswith(_ELF_MAGIC) or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF image (cubin)")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [
        struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
        for i in range(shnum)
    ]
    names = raw[shstrndx][4]  # offset of the section-name string table

    def name(at):
        return elf[names + at : elf.index(b"\0", names + at)].decode()

    return [
        _Section(name(h[0]), h[1], h[4], h[5], h[6], h[7]) for h in raw
    ]


def _entry_symbols(elf: bytes, sections: list[_Section]) -> dict[int, str]:
    """Symbol-table index -> name of every kernel entry point."""
    symtab = next(s for s in sections if s.name == ".symtab")
    strings = sections[symtab.link].offset
    entries = {}
    for index in range(symtab.size // 24):
        st_name, st_info, st_other = struct.unpack_from(
            "<IBB", elf, symtab.offset + 24 * index
        )
        if st_info & 0xF == _STT_FUNC and st_other & _STO_CUDA_ENTRY:
            end = elf.index(b"\0", strings + st_name)
            entries[index] = elf[strings + st_name : end].decode()
    return entries


def _nv_info(elf: bytes, section: _Section) -> dict[int, dict[int, int]]:
    """Per-symbol integer attributes of a ``.nv.info`` section: attr -> {symbol: value}."""
    values: dict[int, dict[int, int]] = collections.defaultdict(dict)
    offset, end = section.offset, section.offset + section.size
    while offset + 4 <= end:
        fmt, attr, field = struct.unpack_from("<BBH", elf, offset)
        if fmt != _NVINFO_SIZED:
            offset += 4  # flag or inline 16-bit value: the record is 4 bytes
            continue
        # Sized records of the resource attributes hold (symbol index, value).
        if field == 8:
            symbol, value = struct.unpack_from("<II", elf, offset + 4)
            values[attr][symbol] = value
        offset += 4 + field
    return values


def _disassemble(cubin: bytes, symbol: int) -> str:
    """nvdisasm's code listing of the function at symbol-table index ``symbol``."""
    import tempfile

    # nvdisasm reads files only; the cubin is small, a temporary file is cheap.
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        run = subprocess.run(
            [nvdisasm_path(), "--print-code", f"--cuda-function-index={symbol}", file.name],
            capture_output=True,
            text=True,
        )
    if run.returncode:
        raise RuntimeError(f"nvdisasm failed ({run.returncode}): {run.stderr.strip()}")
    return run.stdout


def opcode_counts(sass: str) -> collections.Counter:
    """How often each SASS opcode (modifiers dropped, e.g. ``UTMALDG``) occurs."""
    return collections.Counter(_INSTRUCTION.findall(sass))


def kernel_report(compiled, kernel: str | None = None) -> KernelReport:
    """Report on ``kernel`` (default: the only one) of a CuTe DSL compiled function."""
    cubin = kernel_cubin(compiled)
    return cubin_report(cubin, kernel)


def cubin_report(cubin: bytes, kernel: str | None = None) -> KernelReport:
    """Report on ``kernel`` (default: the only one) of a cubin image."""
    sections = _sections(cubin)
    entries = _entry_symbols(cubin, sections)
    if kernel is None:
        if len(entries) != 1:
            raise ValueError(f"cubin has kernels {sorted(entries.values())}; name one")
        (symbol, kernel), = entries.items()
    else:
        matches = [index for index, name in entries.items() if name == kernel]
        if not matches:
            raise ValueError(f"no kernel {kernel!r}; cubin has {sorted(entries.values())}")
        symbol = matches[0]
    by_name = {section.name: section for section in sections}
    info = _nv_info(cubin, by_name[".nv.info"]) if ".nv.info" in by_name else {}
    registers = info.get(_EIATTR_REGCOUNT, {}).get(symbol)
    if registers is None:
        # Older cubins keep the count only in the text section's sh_info top byte.
        registers = by_name[f".text.{kernel}"].info >> 24
    shared = by_name.get(f".nv.shared.{kernel}")
    sass = _disassemble(cubin, symbol)
    counts = opcode_counts(sass)
    target = _TARGET.search(sass)
    return KernelReport(
        kernel=kernel,
        arch=target.group(1) if target else "",
        registers=registers,
        static_shared_bytes=shared.size if shared else 0,
        local_bytes=info.get(_EIATTR_FRAME_SIZE, {}).get(symbol, 0),
        hgmma=counts["HGMMA"],
        warpgroup_arrives=sass.count("WARPGROUP.ARRIVE"),
        utmaldg=counts["UTMALDG"],
        ldl=counts["LDL"],
        stl=counts["STL"],
        sass=sass,
    )
