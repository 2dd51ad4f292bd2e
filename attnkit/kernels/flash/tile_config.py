"""The tile configuration of one kernel launch, and the names the generated tile table
(tiles.py) is written with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..bias_form import FULL16

VARIANTS = ("none", "keypad", "full")  # the bias kinds the kernels specialise on
# A full bias in the inputs' 16-bit dtype, read as it is (bias_form.BIAS_16BIT_ALIGN): the
# inference forward's own variant, served only by the entries that name it (F16), since
# its tiles differ (a 16-bit bias tile changes what spills). Its name is bias_form's.
WIDTHS = ("16bit", "32bit")  # the input widths the lists are kept by
ALL = frozenset(VARIANTS)  # not FULL16
# Short names of the sets a tile serves, as tiles.py writes them.
N = frozenset({"none"})
K = frozenset({"keypad"})
F = frozenset({"full"})
NK = frozenset({"none", "keypad"})  # what a tile that spills with a full bias serves
KF = frozenset({"keypad", "full"})
NF = frozenset({"none", "full"})
F16 = frozenset({FULL16})
UNCAUSAL = (False,)
CAUSAL = (True,)
TMA = frozenset({"tma"})
PTR = frozenset({"ptr"})
BOTH_LOADS = frozenset({"tma", "ptr"})
BOTH_CAUSAL = (False, True)


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Reload the loop-invariant operand tiles (Q; K and V in the dK/dV pass) every
    # iteration instead of holding them in registers: for large head dims.
    reload: bool = False
    # The bias variants this tile serves (one that spills with a full bias serves the
    # others only).
    variants: frozenset = ALL
    # The most main-loop warp instructions per score this entry may compile to, on its
    # target, over the head dims, 16-bit dtypes and variants it serves (None: not
    # gated). The static report (tools/static_report) fails above it.
    budget: Optional[float] = None
    # The causal settings it serves (a tile that spills only with the diagonal's masks
    # serves the unmasked kernel only).
    causal: tuple = BOTH_CAUSAL
    # The loads it serves on sm_90: TMA, and pointers (the fallback for tensors that
    # are not 16-byte aligned, whose address arithmetic holds more registers).
    loads: frozenset = BOTH_LOADS
    # The padded head dims it serves, (lo, hi) inclusive (None: every one of its band):
    # where no tile of a band compiles clean at all of its head dims for some variant.
    dims: Optional[tuple] = None
    # ptxas's register cap per thread (None: its own choice). With 8 warps it often
    # stops at 128 registers and spills; 255 lets such a tile hold what it needs.
    maxnreg: Optional[int] = None

    def __str__(self) -> str:
        r = "-r" if self.reload else ""
        n = f"-reg{self.maxnreg}" if self.maxnreg else ""
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}{r}{n}"


def nest(entries) -> dict:
    """{target: {kernel: {width: {band: (TileConfig, ...)}}}} from (target, kernel, width,
    band, tile) rows, each list in the order of its rows (the first is its default)."""
    out: dict = {}
    for target, kernel, width, band, tile in entries:
        lst = out.setdefault(target, {}).setdefault(kernel, {}).setdefault(width, {})
        lst[band] = lst.get(band, ()) + (tile,)
    for kernels in out.values():  # a width without lists stays, empty (fwd_lo has no fp32 lists)
        for widths in kernels.values():
            for width in WIDTHS:
                widths.setdefault(width, {})
    return out
