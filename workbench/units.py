"""Numbers as text, one way each: bytes, durations, shares, kernel names.

Torch-free and import-free (standard library only), so every layer may use it: io, analysis,
figures, panels, report and the CLI. Each function takes the few options its callers really need
instead of each caller keeping its own copy.

>>> format_bytes(1536), format_bytes(3 * 2**20, significant=3)
('1.50 KiB', '3 MiB')
>>> format_us(812.0), format_ms(12_345.0), format_pct(0.123)
('812 µs', '12.35 ms', '12.3%')
>>> short_name("void at::native::vectorized_layer_norm_kernel<float, float, false>(int, float)")
'at::native::vectorized_layer_norm_kernel'
>>> short_name("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(Params)", templates=True)
'cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>'
"""

from __future__ import annotations

import math

__all__ = ["format_bytes", "format_us", "format_ms", "format_pct", "format_change", "short_name"]

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def format_bytes(n: float | int | None, significant: int | None = None) -> str:
    """Bytes in binary units, the way torch's messages write them: ``1536`` -> ``'1.50 KiB'``,
    ``268_000_000`` -> ``'255.59 MiB'`` (two decimals; whole bytes below 1 KiB; ``'unknown'`` for
    None or NaN).

    ``significant=3`` gives the short labels of figures and evidence text instead: ``'1.5 KiB'``,
    ``'3 MiB'``, ``'1,000 MiB'`` (that many significant digits, never an exponent).
    """
    if _missing(n):
        return "unknown"
    v = float(n)
    sign = "-" if v < 0 else ""
    v = abs(v)
    for unit in _BINARY_UNITS:
        if v < 1024 or unit == _BINARY_UNITS[-1]:
            break
        v /= 1024
    if unit == "B":
        return f"{sign}{v:.0f} B"
    if significant is None:
        return f"{sign}{v:.2f} {unit}"
    if v >= 10 ** significant:
        return f"{sign}{v:,.0f} {unit}"
    return f"{sign}{v:.{significant}g} {unit}"


def format_us(us: float | None) -> str:
    """A duration given in microseconds, in the unit that reads best: ``812 µs``, ``12.9 ms``, ``1.25 s``."""
    if _missing(us):
        return "n/a"
    us = float(us)
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:,.3g} s"
    if a >= 1e3:
        return f"{us / 1e3:,.3g} ms"
    if a >= 100 or a == 0:
        return f"{us:,.0f} µs"
    return f"{us:.3g} µs"


def format_ms(us: float | None, decimals: int = 2, *, unit: str = " ms", missing: str = "-",
              small_in_us: bool = False) -> str:
    """A duration given in microseconds as milliseconds with a fixed number of ``decimals``:
    ``12_345.0`` -> ``'12.35 ms'``. ``unit=""`` leaves the unit to a column header;
    ``small_in_us=True`` writes durations under 1 ms in whole microseconds (``'812 us'``);
    ``missing`` stands for None or NaN."""
    if _missing(us):
        return missing
    if small_in_us and us < 1e3:
        return f"{us:,.0f} us"
    return f"{us / 1e3:,.{decimals}f}{unit}"


def format_pct(fraction: float | None, decimals: int = 1, *, sign: bool = False, missing: str = "-") -> str:
    """A fraction as a percentage: ``0.123`` -> ``'12.3%'``; ``sign=True`` always writes the sign
    (``'+12.3%'``, for changes); ``missing`` stands for None or NaN."""
    if _missing(fraction):
        return missing
    return f"{100 * fraction:{'+' if sign else ''}.{decimals}f}%"


def format_change(base: float | None, test: float | None, decimals: int = 1) -> str:
    """The relative change from ``base`` to ``test`` as a signed percentage (``'+12.3%'``); ``''``
    when either is missing or ``base`` is 0 (no change can be stated)."""
    if _missing(base) or _missing(test) or not base:
        return ""
    return format_pct((test - base) / base, decimals, sign=True)


def short_name(name: str, width: int = 60, *, templates: bool = False, ellipsis: str = "…") -> str:
    """A readable label for a (C++ template) kernel or op name, at most ``width`` characters.

    Drops ``void ``, ``(anonymous namespace)::`` and the argument list. Template arguments are
    dropped too unless ``templates=True``: plots want the short family name
    (``at::native::vectorized_layer_norm_kernel``), while a text table keeps them because the tile
    shape or precision lives there (``cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_...>``). A cut
    name ends in ``ellipsis`` (``'~'`` for plain-ASCII terminals).

    >>> short_name("aten::addmm")
    'aten::addmm'
    """
    s = str(name).replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    if ")#" in s:
        # a record_function label, not a signature: 'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__'
        # and 'Optimizer.step#AdamW.step' read whole (cutting at '(' left 'enumerate')
        t = s.strip()
    elif templates:
        depth = 0
        for i, ch in enumerate(s):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth = max(depth - 1, 0)
            elif ch == "(" and depth == 0 and i > 0:
                s = s[:i]
                break
        t = s.strip() or str(name)
    else:
        depth, out = 0, []
        for ch in s:
            if ch in "<(":
                depth += 1
                continue
            if ch in ">)":
                depth = max(0, depth - 1)
                continue
            if depth == 0:
                out.append(ch)
        t = "".join(out).strip() or s
    return t if len(t) <= width else t[: width - len(ellipsis)] + ellipsis
