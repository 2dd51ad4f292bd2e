"""Read NVIDIA machine code (SASS, as `cuobjdump --dump-sass` prints it): the loops of a
kernel and what one iteration of each issues.

Used by `python -m tools.static_report` to argue the kernels' speed without a GPU.
Everything here is static: it counts instructions in the program text, not executions.

Definitions (also written in the report):

* a loop is the address range [target, branch] of a branch whose target lies at or
  before the branch itself (a backward branch); its length is the number of
  instructions in that range, NOPs excluded. Loops are listed innermost first.
* the matrix instructions of a loop are its HMMA (Ampere's warp-level MMA, shape
  m16n8k16 or m16n8k8 per warp) and HGMMA (Hopper's warp-group MMA, shape 64xNxK per
  group of four warps), and their integer forms IMMA (m16n8k32 for int8, written
  16832) and IGMMA (64xNx32), the int8 forward's Q.K. A warp-group MMA appears once in
  each of its four warps' instruction streams, so the matrix FLOPs (integer operations
  alike) of one iteration of the whole CTA are
  sum(HGMMA and IGMMA m*n*k * 2) * warps / 4 + sum(HMMA and IMMA m*n*k * 2) * warps.
* exponentials are MUFU.EX2, executed by each of the CTA's 32 * warps threads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?BRA(?:\.[A-Z.]+)?\s+(?:`\()?(0x[0-9a-f]+)")
_HGMMA = re.compile(r"[HI]GMMA\.(\d+)x(\d+)x(\d+)")
_HMMA = re.compile(r"[HI]MMA\.(\d+)")
_GROUP_MMA = ("HGMMA", "IGMMA")  # warp-group MMAs (sm_90)
_WARP_MMA = ("HMMA", "IMMA")  # warp-level MMAs


_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


@dataclass(frozen=True)
class Instr:
    addr: int
    text: str  # as printed, with its predicate (@P0, @!UPT ...), without the ";"

    @property
    def opcode(self) -> str:
        """The mnemonic with its modifiers, e.g. "HGMMA.64x32x16.F32"."""
        body = _PREDICATE.sub("", self.text)
        return body.split()[0] if body else ""

    @property
    def op(self) -> str:
        """The base mnemonic, e.g. "HGMMA"."""
        return self.opcode.split(".")[0]


def parse(sass: str) -> list[Instr]:
    """The instructions of a cuobjdump listing of one kernel function."""
    out = []
    for line in sass.splitlines():
        m = _LINE.match(line)
        if m:
            out.append(Instr(int(m.group(1), 16), m.group(2).strip()))
    return out


def _branch_target(ins: Instr) -> int | None:
    m = _BRANCH.match(ins.text)
    return int(m.group(1), 16) if m else None


@dataclass
class Loop:
    start: int  # address of the first instruction (the branch target)
    end: int  # address of the backward branch
    instrs: list[Instr] = field(repr=False)

    @property
    def length(self) -> int:
        return sum(1 for i in self.instrs if i.op != "NOP")

    def count(self, op: str) -> int:
        """Instructions whose base mnemonic is op ("MUFU.EX2" also matches modifiers)."""
        if "." in op:
            return sum(1 for i in self.instrs if i.opcode == op or i.opcode.startswith(op + "."))
        return sum(1 for i in self.instrs if i.op == op)

    def mix(self) -> Counter:
        return Counter(i.op for i in self.instrs if i.op != "NOP")

    def mma_shapes(self) -> Counter:
        """{"HGMMA.64x32x16": 4, "HMMA.16816": 16, "IMMA.16832": 8, ...} per warp."""
        out: Counter = Counter()
        for i in self.instrs:
            if i.op in _GROUP_MMA:
                m = _HGMMA.search(i.opcode)
                out[f"{i.op}.{m.group(1)}x{m.group(2)}x{m.group(3)}"] += 1
            elif i.op in _WARP_MMA:
                out[f"{i.op}.{_HMMA.search(i.opcode).group(1)}"] += 1
        return out

    def mma_flops(self, warps: int) -> float:
        """Matrix FLOPs of one iteration of the whole CTA (see the module docstring)."""
        total = 0.0
        for shape, n in self.mma_shapes().items():
            kind, dims = shape.split(".")
            if kind in _GROUP_MMA:
                m, nn, k = (int(x) for x in dims.split("x"))
                total += n * 2 * m * nn * k * warps / 4
            elif dims.startswith("88"):
                # "8816": m8 n8 k16 (IMMA's older int8 shape)
                m, nn, k = 8, 8, int(dims[2:])
                total += n * 2 * m * nn * k * warps
            else:
                # "16816": m16 n8 k16; "1688": m16 n8 k8 (tf32); "16832": m16 n8 k32 (int8)
                m, nn, k = 16, 8, int(dims[3:])
                total += n * 2 * m * nn * k * warps
        return total

    @property
    def matrix_instrs(self) -> int:
        return sum(self.count(op) for op in _GROUP_MMA + _WARP_MMA)


def loops(instrs: list[Instr]) -> list[Loop]:
    """Every loop (backward branch) of the kernel, innermost (shortest) first."""
    by_addr = {i.addr: n for n, i in enumerate(instrs)}
    out = []
    for n, ins in enumerate(instrs):
        target = _branch_target(ins)
        if target is None or target > ins.addr or target not in by_addr:
            continue
        out.append(Loop(target, ins.addr, instrs[by_addr[target] : n + 1]))
    out.sort(key=lambda lp: lp.end - lp.start)
    return out


def main_loop(instrs: list[Instr]) -> Loop | None:
    """The loop that streams the tiles: among the innermost loops that hold matrix
    instructions (no loop inside them holds any), those with the most matrix
    instructions; of these the first in program order. (The kernels put their
    unmasked tiles first, then the masked ones along a diagonal or an edge, which
    compile to the same matrix instructions.) None if no loop holds any."""
    with_mma = [lp for lp in loops(instrs) if lp.matrix_instrs]
    innermost = [
        lp for lp in with_mma if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in with_mma)
    ]
    if not innermost:
        return None
    most = max(lp.matrix_instrs for lp in innermost)
    return min((lp for lp in innermost if lp.matrix_instrs == most), key=lambda lp: lp.start)


def kernel_uses(instrs: list[Instr], op: str) -> bool:
    return any(i.op == op for i in instrs)
