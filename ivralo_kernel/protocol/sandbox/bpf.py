"""[protocol] A small assembler for classic BPF, the language of seccomp filters.

A seccomp filter is a program of ``struct sock_filter`` (8 bytes: code u16, jt u8, jf u8, k u32)
that the Linux kernel runs on each system call's ``struct seccomp_data``. Classic BPF jumps only
forward, by at most 255 instructions; this assembler lets the caller name the targets (labels)
and works the offsets out, refusing a program whose jumps do not fit.

Written here rather than taken from libseccomp (pyseccomp): the supervisor, which installs the
filter in the fallback, imports only the standard library, and the filter is a short list of
refusals that needs none of libseccomp's optimiser.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# Instruction classes and modes (linux/filter.h, linux/bpf_common.h).
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = the 32-bit word at offset k of seccomp_data
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K: A &= k

MAX_JUMP = 255
MAX_INSTRUCTIONS = 4096  # BPF_MAXINSNS


class BpfError(ValueError):
    """The program cannot be assembled (a jump too far, an unknown label)."""


@dataclass
class _Instruction:
    code: int
    k: int
    jt: str | None = None  # label, or None: the next instruction
    jf: str | None = None


@dataclass
class Program:
    """Instructions in order; ``label`` names the position of the next one."""

    _code: list[_Instruction] = field(default_factory=list)
    _labels: dict[str, int] = field(default_factory=dict)

    def label(self, name: str) -> None:
        if name in self._labels:
            raise BpfError(f"label {name!r} defined twice")
        self._labels[name] = len(self._code)

    def load(self, offset: int) -> None:
        self._code.append(_Instruction(LD_W_ABS, offset))

    def and_(self, mask: int) -> None:
        self._code.append(_Instruction(AND_K, mask))

    def jump_if_equal(self, k: int, then: str | None, otherwise: str | None = None) -> None:
        self._code.append(_Instruction(JEQ_K, k, then, otherwise))

    def jump_if_at_least(self, k: int, then: str | None, otherwise: str | None = None) -> None:
        self._code.append(_Instruction(JGE_K, k, then, otherwise))

    def jump_if_any_bit(self, mask: int, then: str | None, otherwise: str | None = None) -> None:
        self._code.append(_Instruction(JSET_K, mask, then, otherwise))

    def ret(self, value: int) -> None:
        self._code.append(_Instruction(RET_K, value))

    def __len__(self) -> int:
        return len(self._code)

    def assemble(self) -> bytes:
        """The program as the kernel reads it (native byte order)."""
        if not self._code or self._code[-1].code != RET_K:
            raise BpfError("a seccomp program must end with a return")
        if len(self._code) > MAX_INSTRUCTIONS:
            raise BpfError(f"{len(self._code)} instructions: the kernel takes at most {MAX_INSTRUCTIONS}")
        out = bytearray()
        for index, ins in enumerate(self._code):
            jt, jf = (self._offset(index, target) for target in (ins.jt, ins.jf))
            out += struct.pack("=HBBI", ins.code, jt, jf, ins.k & 0xFFFFFFFF)
        return bytes(out)

    def _offset(self, index: int, target: str | None) -> int:
        if target is None:
            return 0
        if target not in self._labels:
            raise BpfError(f"jump to an unknown label {target!r}")
        offset = self._labels[target] - index - 1
        if not 0 <= offset <= MAX_JUMP:
            raise BpfError(f"jump from {index} to {target!r} is {offset} instructions (classic BPF: 0..{MAX_JUMP})")
        return offset
