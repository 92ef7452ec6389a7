"""How the report writes a figure, in one place: a mean ± std over runs (`spread`, `fmt_spread`),
the decimals of a step (`fine_digits`), a share in per cent, FLOPs, bytes in the unit that fits
them, a count with K, M or B, a duration, and a list of names in a sentence ('a, b and c'). The
rooms that write a figure in one of these shapes import it from here, so it reads the same in the
table, the sentences and projection.md; a plain figure ('43.6 ms') keeps its format where it is
written."""
from __future__ import annotations

import statistics


def spread(values: list, digits: int, scale: float = 1.0, unit: str = "") -> str:
    """mean ± std (sample std over repeats) of the values that were measured; '—' when none were."""
    values = [v * scale for v in values if v is not None]
    if not values:
        return "—"
    mean = statistics.fmean(values)
    text = f"{mean:,.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):,.{digits}f}"
    return text + unit


def fine_digits(value: float) -> int:
    """Decimals for a step in ms or an epoch in s, three figures or more ('402.3', '78.4', '6.84',
    '0.684'): the images/s beside a step, the global batch ÷ that step, can be checked from it."""
    return 1 if value >= 10 else 2 if value >= 1 else 3


def fmt_spread(mean: float, std: float, digits: int, runs: int, unit: str = "") -> str:
    """A configuration's figure as the table shows it: 'mean ± std', the std with more than one
    run only."""
    text = f"{mean:,.{digits}f}"
    if runs > 1:
        text += f" ± {std:,.{digits}f}"
    return text + unit


def fmt_percent(fraction: float, signed: bool = False) -> str:
    """A share in per cent as the table writes it ('71 %'), a decimal below 10 %; with its sign
    if `signed`."""
    digits = 1 if abs(fraction) < 0.1 else 0
    return f"{fraction * 100:{'+' if signed else ''}.{digits}f} %"


def fmt_flops(flops: float) -> str:
    """FLOPs in three figures with their prefix: '2.75 MFLOPs', '1.82 GFLOPs', '562 GFLOPs'."""
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        value = flops / size
        if value >= 0.9995:
            return f"{value:,.{2 if value < 9.995 else 1 if value < 99.95 else 0}f} {prefix}FLOPs"
    return f"{flops:,.0f} FLOPs"


UNIT_NAMES = {1024: ("B", "KiB", "MiB", "GiB", "TiB"), 1000: ("B", "kB", "MB", "GB", "TB")}


def byte_unit(nbytes: float, base: int = 1024) -> tuple[str, float]:
    """The unit (and its size in bytes) in which `nbytes` reads from 1 to 999: B to TiB, or B to TB
    with `base` 1000 (traffic, as bandwidths are given)."""
    names = UNIT_NAMES[base]
    power = 0
    while power + 1 < len(names) and nbytes >= 999.5 * base**power:
        power += 1
    return names[power], base**power


def fmt_bytes(nbytes: float, base: int = 1024) -> str:
    """Bytes in the unit that fits them, three figures or so: '355 KiB',
    '1.3 MiB', '80.0 GiB', '121 kB'."""
    unit, size = byte_unit(nbytes, base)
    value = nbytes / size
    if unit == "B" or value >= 99.95:
        return f"{value:,.0f} {unit}"
    return f"{value:,.1f} {unit}"


def fmt_count(count: float) -> str:
    """A count in three figures with K, M or B (thousands, millions,
    billions): '30.3K', '1.02M', '7.16B'."""
    for suffix, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        value = count / size
        if value >= 0.9995:
            digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
            return f"{value:,.{digits}f}{suffix}"
    return f"{count:,.0f}"


def fmt_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f} s"


def listed(parts: list[str], conjunction: str = "and") -> str:
    """'a', 'a and b', 'a, b and c' (or 'a, b or c')."""
    return (", ".join(parts[:-1]) + f" {conjunction} " + parts[-1] if len(parts) > 1
            else parts[0])
