"""The compiled loop of ``wire_samples``: one pass over a poll's msgpack samples.

Imported on first use (numba takes a moment to import; the compiled code is cached beside
this file, ``cache=True``). What it accepts and why: ``wire_samples``' docstring.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from fleetcare.pipeline.wire_samples import (
    AN_INT,
    BOOL,
    BOOL_LIST,
    END_SECOND,
    F32,
    F64,
    FIRST_SECOND,
    FLOAT,
    INT,
    STR,
    TS,
)

_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def _u(buf: np.ndarray, p: int, width: int) -> np.uint64:  # pragma: no cover - compiled
    """``width`` big-endian bytes at ``p`` as an unsigned integer."""
    v = np.uint64(0)
    for j in range(width):
        v = (v << np.uint64(8)) | np.uint64(buf[p + j])
    return v


@numba.njit(cache=True, nogil=True, inline="always")
def _int_at(buf: np.ndarray, p: int) -> tuple[Any, Any, bool]:  # pragma: no cover
    """The msgpack integer at ``p``: (value, size in bytes, ok). Not ok: not an integer,
    or an unsigned one past int64."""
    h = buf[p]
    if h < 0x80:
        return np.int64(h), 1, True
    if h >= 0xE0:
        return np.int64(h) - 256, 1, True
    if 0xCC <= h <= 0xCF:
        width = 1 << (h - 0xCC)
        u = _u(buf, p + 1, width)
        if u >= np.uint64(1) << np.uint64(63):
            return 0, 0, False
        return np.int64(u), 1 + width, True
    if 0xD0 <= h <= 0xD3:
        width = 1 << (h - 0xD0)
        u = _u(buf, p + 1, width)
        if width == 8:
            return np.int64(u), 9, True  # (two's complement: the cast wraps)
        v = np.int64(u)
        if v >= np.int64(1) << np.int64(8 * width - 1):
            v -= np.int64(1) << np.int64(8 * width)
        return v, 1 + width, True
    return 0, 0, False


@numba.njit(cache=True, nogil=True, inline="always")
def _field(buf: np.ndarray, p: int, klen: int, names: np.ndarray, name_at: np.ndarray,
           guess: int) -> int:  # pragma: no cover - compiled
    """The index of the field whose name is the ``klen`` bytes at ``p``, or -1; fields
    are tried from ``guess`` on (msgspec writes them in order)."""
    nf = len(name_at) - 1
    f = guess - 1
    for _ in range(nf):
        f += 1
        if f >= nf:  # (not ``% nf``: a division for every key)
            f = 0
        lo = name_at[f]
        if name_at[f + 1] - lo != klen:
            continue
        same = True
        for j in range(klen):
            if buf[p + j] != names[lo + j]:
                same = False
                break
        if same:
            return f
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _digits(buf: np.ndarray, p: int, n: int) -> int:  # pragma: no cover - compiled
    """The ``n`` ASCII digits at ``p`` as a number, -1 if one is not a digit."""
    v: Any = 0
    for j in range(n):
        d = np.int64(buf[p + j]) - 48
        if d < 0 or d > 9:
            return -1
        v = v * 10 + d
    return v


@numba.njit(cache=True, nogil=True)
def _rfc3339(buf: np.ndarray, p: Any, n: Any) -> tuple[Any, Any]:  # pragma: no cover
    """``YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM)`` at ``p`` (``n`` bytes) as
    (seconds since the epoch, nanoseconds); (-1, 0) for anything else (msgspec decides)."""
    if n < 20 or buf[p + 4] != 45 or buf[p + 7] != 45 or buf[p + 10] != 84 \
            or buf[p + 13] != 58 or buf[p + 16] != 58:  # '-', 'T', ':'
        return np.int64(-1), np.int64(0)
    year, month, day = _digits(buf, p, 4), _digits(buf, p + 5, 2), _digits(buf, p + 8, 2)
    hour, minute, second = (_digits(buf, p + 11, 2), _digits(buf, p + 14, 2),
                            _digits(buf, p + 17, 2))
    q = p + 19
    micro = 0
    if buf[q] == 46:  # '.'
        k = 0
        while q + 1 + k < p + n and 48 <= buf[q + 1 + k] <= 57:
            k += 1
        if k < 1 or k > 6:
            return np.int64(-1), np.int64(0)
        micro = _digits(buf, q + 1, k) * 10 ** (6 - k)
        q += 1 + k
    rest = p + n - q
    offset = 0
    if rest == 1 and buf[q] == 90:  # 'Z'
        offset = 0
    elif rest == 6 and (buf[q] == 43 or buf[q] == 45) and buf[q + 3] == 58:  # +HH:MM
        oh, om = _digits(buf, q + 1, 2), _digits(buf, q + 4, 2)
        if oh < 0 or om < 0 or oh > 23 or om > 59:
            return np.int64(-1), np.int64(0)
        offset = (oh * 60 + om) * 60 * (1 if buf[q] == 43 else -1)
    else:
        return np.int64(-1), np.int64(0)
    if (year < 1971 or year > 9998 or month < 1 or month > 12 or day < 1 or hour < 0
            or hour > 23 or minute < 0 or minute > 59 or second < 0 or second > 59):
        return np.int64(-1), np.int64(0)  # (a year apart from the ends: offsets move it)
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    last = 29 if month == 2 and leap else _MONTH_DAYS[month - 1]
    if day > last:
        return np.int64(-1), np.int64(0)
    y = year - (1 if month <= 2 else 0)  # days from 1970-01-01 (civil calendar)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    sec = days * 86400 + hour * 3600 + minute * 60 + second - offset
    return np.int64(sec), np.int64(micro * 1000)


@numba.njit(cache=True, nogil=True, inline="always")
def _take_back(str_end: np.ndarray, str_mark: np.ndarray, item_end: np.ndarray,
               item_mark: np.ndarray) -> None:  # pragma: no cover - compiled
    """Forget what the sample being walked wrote (its rows end where they did before it)."""
    str_end[:] = str_mark
    item_end[:] = item_mark


@numba.njit(cache=True, nogil=True)
def walk(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, names: np.ndarray,
          name_at: np.ndarray, kind: np.ndarray, required: np.ndarray, slot: np.ndarray,
          store: np.ndarray, max_list: int, first: int, ok: np.ndarray,
          present: np.ndarray, num: np.ndarray, code: np.ndarray, size: np.ndarray,
          strs: np.ndarray, str_end: np.ndarray, items: np.ndarray, item_end: np.ndarray
          ) -> int:  # pragma: no cover - compiled
    """Decode the samples' maps from sample ``first`` on (module docstring). Per field
    ``f`` and sample ``i``: ``present[f, i]``; ``num[slot[f], i]`` the integer, boolean,
    microseconds since the epoch, or a float's bits (``code``: F64 / F32 bits or AN_INT);
    ``size[slot[f], i]`` a string's bytes or a list's items, which are appended to row
    ``store[f]`` of ``strs`` / ``items`` (``str_end`` / ``item_end``: how far each row is
    filled; what a sample that does not decode wrote is taken back). ``ok[i]``: the
    sample decoded. Returns -1, or the sample for which a row of ``strs`` or ``items`` is
    full (nothing of it kept: the caller makes room and calls again from it)."""
    nfields = len(kind)
    str_mark = str_end.copy()
    item_mark = item_end.copy()
    for i in range(first, len(starts)):
        str_mark[:] = str_end
        item_mark[:] = item_end
        p = starts[i]
        end = ends[i]
        h = buf[p]
        if (h & 0xF0) == 0x80:
            count = h & 0x0F
            p += 1
        elif h == 0xDE:
            count = (np.int64(buf[p + 1]) << 8) | buf[p + 2]
            p += 3
        else:
            continue
        seen = np.uint64(0)
        guess = 0
        good = True
        for _ in range(count):
            if p >= end:  # (every read stays inside the sample, whatever its bytes)
                good = False
                break
            kh = buf[p]
            if (kh & 0xE0) != 0xA0:
                good = False
                break
            klen = kh & 0x1F
            f = _field(buf, p + 1, klen, names, name_at, guess)
            if f < 0 or (seen >> np.uint64(f)) & np.uint64(1):
                good = False
                break
            seen |= np.uint64(1) << np.uint64(f)
            guess = f + 1
            p += 1 + klen
            v = buf[p]
            k = kind[f]
            if v == 0xC0:  # nil
                if required[f]:
                    good = False
                    break
                p += 1
                continue
            if k == INT:
                val, n, fine = _int_at(buf, p)
                if not fine:
                    good = False
                    break
                num[slot[f], i] = val
                p += n
            elif k == FLOAT:
                if v == 0xCB:
                    num[slot[f], i] = np.int64(_u(buf, p + 1, 8))
                    code[slot[f], i] = F64
                    p += 9
                elif v == 0xCA:
                    num[slot[f], i] = np.int64(_u(buf, p + 1, 4))
                    code[slot[f], i] = F32
                    p += 5
                else:
                    val, n, fine = _int_at(buf, p)
                    if not fine:
                        good = False
                        break
                    num[slot[f], i] = val
                    code[slot[f], i] = AN_INT
                    p += n
            elif k == BOOL:
                if v != 0xC2 and v != 0xC3:
                    good = False
                    break
                num[slot[f], i] = v == 0xC3
                p += 1
            elif k == STR:
                if (v & 0xE0) == 0xA0:
                    n, hl = np.int64(v & 0x1F), 1
                elif v == 0xD9:
                    n, hl = np.int64(buf[p + 1]), 2
                elif v == 0xDA:
                    n, hl = (np.int64(buf[p + 1]) << 8) | buf[p + 2], 3
                else:
                    good = False
                    break
                if p + hl + n > end:
                    good = False
                    break
                row = store[f]
                o = str_end[row]
                if o + n > strs.shape[1]:
                    _take_back(str_end, str_mark, item_end, item_mark)
                    return i
                for j in range(n):
                    b = buf[p + hl + j]
                    if b >= 0x80:  # not ASCII: msgspec checks UTF-8
                        good = False
                        break
                    strs[row, o + j] = b
                if not good:
                    break
                str_end[row] = o + n
                size[slot[f], i] = n
                p += hl + n
            elif k == TS:
                if v == 0xD6 and buf[p + 1] == 0xFF:
                    sec, nano = np.int64(_u(buf, p + 2, 4)), np.int64(0)
                    p += 6
                elif v == 0xD7 and buf[p + 1] == 0xFF:
                    u = _u(buf, p + 2, 8)
                    sec = np.int64(u & np.uint64(0x3FFFFFFFF))
                    nano = np.int64(u >> np.uint64(34))
                    p += 10
                elif v == 0xC7 and buf[p + 1] == 12 and buf[p + 2] == 0xFF:
                    nano = np.int64(_u(buf, p + 3, 4))
                    sec = np.int64(_u(buf, p + 7, 8))
                    p += 15
                elif (v & 0xE0) == 0xA0 or v == 0xD9:  # text: RFC 3339
                    n, hl = (np.int64(v & 0x1F), 1) if v != 0xD9 else (np.int64(buf[p + 1]), 2)
                    if p + hl + n > end:
                        good = False
                        break
                    sec, nano = _rfc3339(buf, p + hl, n)
                    p += hl + n
                else:
                    good = False
                    break
                if (nano % 1000 != 0 or nano >= 1_000_000_000
                        or not FIRST_SECOND <= sec < END_SECOND):
                    good = False
                    break
                num[slot[f], i] = sec * 1_000_000 + nano // 1000
            else:  # a list
                if (v & 0xF0) == 0x90:
                    n, hl = np.int64(v & 0x0F), 1
                elif v == 0xDC:
                    n, hl = (np.int64(buf[p + 1]) << 8) | buf[p + 2], 3
                else:
                    good = False
                    break
                if n > max_list:
                    good = False
                    break
                p += hl
                row = store[f]
                o = item_end[row]
                if o + n > items.shape[1]:
                    _take_back(str_end, str_mark, item_end, item_mark)
                    return i
                dst = items[row]
                if p + n <= end:  # the common list first: every item one byte
                    j = 0
                    while j < n:
                        b = buf[p + j]
                        if k == BOOL_LIST:
                            if b != 0xC2 and b != 0xC3:
                                break
                            dst[o + j] = b == 0xC3
                        else:
                            if b >= 0x80 and b < 0xE0:
                                break
                            dst[o + j] = np.int64(b) if b < 0x80 else np.int64(b) - 256
                        j += 1
                    if j == n:
                        item_end[row] = o + n
                        size[slot[f], i] = n
                        p += n
                        present[f, i] = True
                        continue
                for j in range(n):
                    if p >= end:
                        good = False
                        break
                    if k == BOOL_LIST:
                        if buf[p] != 0xC2 and buf[p] != 0xC3:
                            good = False
                            break
                        items[row, o + j] = buf[p] == 0xC3
                        p += 1
                    else:
                        val, w, fine = _int_at(buf, p)
                        if not fine:
                            good = False
                            break
                        items[row, o + j] = val
                        p += w
                if not good:
                    break
                item_end[row] = o + n
                size[slot[f], i] = n
            present[f, i] = True
        if not good or p != end:
            present[:, i] = False
            _take_back(str_end, str_mark, item_end, item_mark)
            continue
        for f in range(nfields):
            if required[f] and not (seen >> np.uint64(f)) & np.uint64(1):
                good = False
        if good:
            ok[i] = True
        else:
            present[:, i] = False
            _take_back(str_end, str_mark, item_end, item_mark)
    return -1
