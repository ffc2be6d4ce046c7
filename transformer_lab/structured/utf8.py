"""Code points to UTF-8 byte ranges: how a character class becomes an automaton over bytes.

A class such as [a-zé中] is a set of code point ranges. The automaton reads bytes, so
each range becomes a few sequences of byte ranges, one per run of code points whose
UTF-8 forms differ only in a box of byte ranges. For example U+0080-U+07FF (every
two-byte character) is the one sequence [C2-DF][80-BF], while U+00E9-U+4E2D needs five.
A token that ends inside a character then ends inside one of these sequences: the
automaton is in a state that still wants the character's last bytes.

The split is the classic one (Russ Cox's and Rust's utf8-ranges): cut a range where
its UTF-8 length changes, drop the surrogates (U+D800-U+DFFF have no UTF-8), then cut
it until, for every trailing 6-bit group, the range either spans all 64 values or
keeps the leading bits fixed. What is left is a product of byte ranges.
"""
from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
# The last code point of each UTF-8 length: 1, 2, 3 and 4 bytes.
LENGTH_ENDS = (0x7F, 0x7FF, 0xFFFF, MAX_CODE_POINT)


def merge_ranges(ranges) -> tuple[tuple[int, int], ...]:
    """Sorted, non-overlapping, non-adjacent (lo, hi) ranges covering the same code points."""
    merged = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def complement(ranges) -> tuple[tuple[int, int], ...]:
    """Every code point (surrogates aside) not in ranges: what [^...] matches."""
    out, next_lo = [], 0
    for lo, hi in merge_ranges(ranges):
        if lo > next_lo:
            out.append((next_lo, lo - 1))
        next_lo = hi + 1
    if next_lo <= MAX_CODE_POINT:
        out.append((next_lo, MAX_CODE_POINT))
    return without_surrogates(out)


def without_surrogates(ranges) -> tuple[tuple[int, int], ...]:
    out = []
    for lo, hi in merge_ranges(ranges):
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            out.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            out.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            out.append((SURROGATES[1] + 1, hi))
    return tuple(out)


def byte_sequences(lo, hi) -> list[list[tuple[int, int]]]:
    """The code points lo..hi as sequences of byte ranges: the UTF-8 of a code point in
    the range is exactly a byte string matched by one of the sequences."""
    out = []
    for a, b in without_surrogates([(lo, hi)]):
        start = a
        for end in LENGTH_ENDS:  # one UTF-8 length at a time
            if start > b:
                break
            if start <= end:
                _split(start, min(b, end), out)
                start = end + 1
    return out


def _split(lo, hi, out):
    """Append the sequences of lo..hi, all of one UTF-8 length."""
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):  # the i trailing 6-bit groups
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:  # the range crosses a boundary of these groups
            if lo & m != 0:  # lo does not start a full block: cut it off
                _split(lo, lo | m, out)
                _split((lo | m) + 1, hi, out)
                return
            if hi & m != m:  # hi does not end one
                _split(lo, (hi & ~m) - 1, out)
                _split(hi & ~m, hi, out)
                return
    first, last = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(list(zip(first, last)))
