"""The page headers of a Parquet column chunk, checked against the chunk's metadata before
pyarrow reads the chunk (the export verifier, :mod:`accord.governance.export_verify`).

pyarrow allocates what a page header claims (its uncompressed size, its dictionary's
values) before it decodes a value, and checks a page header against nothing in the file's
metadata; an export may be a forger's. :func:`chunk_problem` walks a column chunk's pages
as pyarrow does (from its dictionary page, or its first data page, to the end of its
``total_compressed_size`` bytes, page by page by each header's ``compressed_page_size``),
reading only each header (at most :data:`PAGE_HEADER_LIMIT` bytes), and says why the chunk
is not to be read: a header that is not a well-formed Thrift compact-protocol
``PageHeader``, a page past the chunk's end or past its uncompressed size, a dictionary
of more values than its bytes can hold, more values than the row group's rows, an encoding
that repeats a value without its bytes (``DELTA_BYTE_ARRAY``).

No maintained package parses Parquet page headers cheaply: pyarrow exposes no page
reader, and fastparquet's Thrift parser comes with numpy, pandas and cramjam. The reader
here knows the few fields it checks (parquet-format's ``PageHeader``,
``DataPageHeader``, ``DictionaryPageHeader``, ``DataPageHeaderV2``) and skips the others
(statistics, CRC, unknown fields), strictly: a type that does not match, a field given
twice, an overlong varint, nesting deeper than :data:`_DEPTH` are malformed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO

__all__ = ["PAGE_HEADER_LIMIT", "Malformed", "PageHeader", "chunk_problem", "read_page_header"]

#: The longest page header read, in bytes. pyarrow's headers are some 20 to 50 bytes,
#: plus a data page's statistics: its min and max, each at most 4 KiB (longer ones are
#: not written).
PAGE_HEADER_LIMIT = 64 << 10
#: The first read of a page header (doubled up to :data:`PAGE_HEADER_LIMIT` while short).
_FIRST_READ = 1 << 10
#: The deepest nesting of structs and lists a header may hold (a statistics struct in a
#: data page header in the page header: 3).
_DEPTH = 16

# parquet-format's PageType
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
_PAGE_TYPES = {DATA_PAGE: "data page", INDEX_PAGE: "index page",
               DICTIONARY_PAGE: "dictionary page", DATA_PAGE_V2: "data page (v2)"}  # fmt: skip
# parquet-format's Encoding: what a page's values may be in. DELTA_BYTE_ARRAY (7) is not:
# each value is a prefix of the one before and a suffix, so a long value repeats at a
# few bits a row, as a dictionary's does (the export never writes it).
_ENCODINGS = {0: "PLAIN", 2: "PLAIN_DICTIONARY", 3: "RLE", 4: "BIT_PACKED",
              5: "DELTA_BINARY_PACKED", 6: "DELTA_LENGTH_BYTE_ARRAY", 8: "RLE_DICTIONARY",
              9: "BYTE_STREAM_SPLIT"}  # fmt: skip
_DICTIONARY_ENCODINGS = {2, 8}  # a data page's values as indexes into the dictionary
#: The fewest bytes one PLAIN value of a physical type takes (a dictionary page's values).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12,
          "BYTE_ARRAY": 4, "FIXED_LEN_BYTE_ARRAY": 1}  # fmt: skip

# Thrift compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT, _UUID = 9, 10, 11, 12, 13


class Malformed(ValueError):
    """Bytes that are not the page header they should be (the message says why)."""


class _Short(Exception):
    """The header goes on past the bytes read (read more, up to the limit)."""


@dataclass
class PageHeader:
    """The fields of a ``PageHeader`` the checks use; ``length`` is the header's bytes."""

    type: int
    uncompressed_page_size: int
    compressed_page_size: int
    length: int = 0
    #: the data page's, dictionary page's or data page v2's (None for an index page)
    num_values: int | None = None
    encoding: int | None = None
    #: a data page v2's levels, bytes (stored uncompressed before its values)
    levels_bytes: int = 0


class _Reader:
    """A Thrift compact-protocol reader over ``data``; :class:`_Short` at its end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Short
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self, bits: int) -> int:
        shift, value = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift >= bits + 7:
                raise Malformed("a varint longer than its type")
        if value >> bits:
            raise Malformed("a varint past its type's range")
        return value

    def zigzag(self, bits: int) -> int:
        n = self.varint(bits)
        return (n >> 1) ^ -(n & 1)

    def skip(self, n: int) -> None:
        if n < 0:
            raise Malformed("a negative length")
        if self.pos + n > len(self.data):
            raise _Short
        self.pos += n

    def fields(self) -> Any:
        """The (id, type) of each field of a struct, to its stop; the caller reads or
        skips each value before asking for the next."""
        last, seen = 0, set()
        while True:
            head = self.byte()
            if head == 0:
                return
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag(16)
            if fid in seen:
                raise Malformed(f"field {fid} given twice")
            seen.add(fid)
            last = fid
            yield fid, kind

    def i32(self, kind: int, what: str) -> int:
        if kind != _I32:
            raise Malformed(f"{what} is not an i32")
        return self.zigzag(32)

    def value(self, kind: int, depth: int) -> None:
        """Skip a value of ``kind``."""
        if depth > _DEPTH:
            raise Malformed(f"nested deeper than {_DEPTH}")
        if kind in (_TRUE, _FALSE):
            return  # a struct field's bool is in its type
        if kind == _BYTE:
            self.skip(1)
        elif kind == _I16:
            self.varint(16)
        elif kind == _I32:
            self.varint(32)
        elif kind == _I64:
            self.varint(64)
        elif kind == _DOUBLE:
            self.skip(8)
        elif kind == _UUID:
            self.skip(16)
        elif kind == _BINARY:
            self.skip(self.varint(32))
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint(32)
            for _ in range(size):  # each element at least a byte: bounded by the bytes
                if element in (_TRUE, _FALSE):
                    self.skip(1)
                else:
                    self.value(element, depth + 1)
        elif kind == _MAP:
            size = self.varint(32)
            if size:
                types = self.byte()
                for _ in range(size):
                    for element in (types >> 4, types & 0x0F):
                        if element in (_TRUE, _FALSE):
                            self.skip(1)
                        else:
                            self.value(element, depth + 1)
        elif kind == _STRUCT:
            for _, inner in self.fields():
                self.value(inner, depth + 1)
        else:
            raise Malformed(f"an unknown Thrift type {kind}")


def _sub_header(r: _Reader, header: PageHeader, v2: bool) -> None:
    """A DataPageHeader(V2)'s or DictionaryPageHeader's values and encoding (the same ids:
    1 num_values, 2 (v1, dictionary) or 4 (v2) encoding; v2: 5, 6 the levels' bytes)."""
    encoding_id = 4 if v2 else 2
    for fid, kind in r.fields():
        if fid == 1:
            header.num_values = r.i32(kind, "num_values")
        elif fid == encoding_id:
            header.encoding = r.i32(kind, "encoding")
        elif v2 and fid in (5, 6):
            size = r.i32(kind, "a levels' byte length")
            if size < 0:
                raise Malformed("a negative levels' byte length")
            header.levels_bytes += size
        else:
            r.value(kind, 2)
    if header.num_values is None or header.encoding is None:
        raise Malformed("its page header holds no num_values or encoding")


def read_page_header(data: bytes) -> PageHeader:
    """The page header at the start of ``data``; :class:`Malformed` when it is none,
    :class:`_Short` when it goes on past ``data``."""
    r = _Reader(data)
    found: dict[int, int] = {}
    subs = {5: DATA_PAGE, 7: DICTIONARY_PAGE, 8: DATA_PAGE_V2}
    sub: tuple[int, int] | None = None  # (the page type it is for, where it starts)
    for fid, kind in r.fields():
        if fid in (1, 2, 3):
            found[fid] = r.i32(kind, ("type", "uncompressed_page_size",
                                      "compressed_page_size")[fid - 1])  # fmt: skip
        elif fid in subs:
            if kind != _STRUCT:
                raise Malformed(f"field {fid} is not a struct")
            if sub is not None:
                raise Malformed("two page headers in one (data, dictionary)")
            sub = (subs[fid], r.pos)
            r.value(_STRUCT, 1)
        else:
            r.value(kind, 1)
    if len(found) < 3:
        raise Malformed("it lacks a type, uncompressed_page_size or compressed_page_size")
    header = PageHeader(found[1], found[2], found[3], length=r.pos)
    if header.type not in _PAGE_TYPES:
        raise Malformed(f"an unknown page type {header.type}")
    if header.type != INDEX_PAGE:
        if sub is None or sub[0] != header.type:
            raise Malformed(f"a {_PAGE_TYPES[header.type]} without its header")
        inner = _Reader(data[: header.length])
        inner.pos = sub[1]
        _sub_header(inner, header, v2=header.type == DATA_PAGE_V2)
    return header


def _header_at(f: BinaryIO, at: int, end: int) -> PageHeader:
    """The page header at byte ``at`` of ``f``, read (at most :data:`PAGE_HEADER_LIMIT`
    bytes, and not past ``end``) in growing pieces."""
    size = _FIRST_READ
    while True:
        want = min(size, end - at, PAGE_HEADER_LIMIT)
        f.seek(at)
        data = f.read(want)
        try:
            return read_page_header(data)
        except _Short:
            if len(data) < want or want == end - at:
                raise Malformed("it goes on past the column chunk's end") from None
            if want >= PAGE_HEADER_LIMIT:
                raise Malformed(f"it is longer than {PAGE_HEADER_LIMIT:,} bytes, the "
                                "verifier's limit (pyarrow writes some 50, plus at most "
                                "8 KiB of statistics)") from None  # fmt: skip
            size *= 4


def chunk_problem(f: BinaryIO, chunk: Any, rows: int, data_end: int) -> str | None:
    """Why the column chunk ``chunk`` (pyarrow's ``ColumnChunkMetaData``) of a row group
    of ``rows`` rows is not to be read (None when it may be), from its page headers in
    ``f`` (the Parquet file, whose column chunks end by ``data_end``, where its footer
    starts): each page within the chunk, the pages filling it; no page larger,
    uncompressed, than the chunk's ``total_uncompressed_size`` (nor all of them
    together); one dictionary page at most, first, of at most as many values as its
    bytes hold, and only where the chunk's metadata declares it (the verifier reads a
    column as a dictionary where it does); at most ``rows`` values in its data pages
    (the export's columns are flat: a value a row); known encodings, not
    DELTA_BYTE_ARRAY, a dictionary's only with a dictionary page."""
    if chunk.file_path:
        return f"its column chunk is said to be in another file ({chunk.file_path!r})"
    start = chunk.data_page_offset
    dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
    if dictionary is not None and 0 < dictionary < start:  # as pyarrow finds the chunk
        start = dictionary
    length, total = chunk.total_compressed_size, chunk.total_uncompressed_size
    if rows == 0 and start < 4:  # an empty group (pyarrow writes its chunks at 0): not read
        return None
    end = start + length
    if start < 4 or length < 0 or end > data_end:
        return (f"its column chunk (bytes {start:,} to {end:,}) is not within the file's "
                f"data (bytes 4 to {data_end:,})")  # fmt: skip
    width = _WIDTH.get(chunk.physical_type, 1)
    at, page, values, uncompressed = start, 0, 0, 0
    while at < end:
        page += 1
        where = f"page {page} (at byte {at:,})"
        if page > rows + 2:  # a dictionary page, then at least a value a data page
            return f"{where}: more pages than the row group's {rows:,} rows"
        try:
            h = _header_at(f, at, end)
        except Malformed as exc:
            return f"{where}: its header is not a Parquet page header ({exc})"
        kind = _PAGE_TYPES[h.type]
        if h.compressed_page_size < 0 or h.uncompressed_page_size < 0:
            return f"{where}: its header claims a negative size"
        at += h.length + h.compressed_page_size
        if at > end:
            return (f"{where}: its header claims {h.compressed_page_size:,} bytes "
                    f"(compressed), past the column chunk's end ({length:,} bytes, its "
                    "metadata says)")  # fmt: skip
        uncompressed += h.uncompressed_page_size
        if uncompressed > total:
            return (f"{where}: its header claims {h.uncompressed_page_size:,} bytes "
                    f"uncompressed, more than the column chunk's {total:,} (its metadata "
                    "says) with the pages before it")  # fmt: skip
        if h.type == DICTIONARY_PAGE:
            if page != 1:
                return f"{where}: a dictionary page after the chunk's first page"
            if dictionary is None:  # pyarrow would read it: the verifier reads the column
                # as a dictionary only where the metadata declares one
                return f"{where}: a dictionary page the column chunk's metadata does not declare"
            if h.num_values is None or not 0 <= h.num_values <= h.uncompressed_page_size // width:
                return (f"{where}: its dictionary claims {h.num_values:,} values, more than "
                        f"its {h.uncompressed_page_size:,} bytes hold")  # fmt: skip
            if h.encoding not in (0, 2):
                return f"{where}: its dictionary is not PLAIN (encoding {h.encoding})"
        elif h.type in (DATA_PAGE, DATA_PAGE_V2):
            n = h.num_values if h.num_values is not None else -1
            values += n
            if n < 0 or values > rows:
                return (f"{where}: its header claims {n:,} values, past the row group's "
                        f"{rows:,} rows with the pages before it")  # fmt: skip
            if h.encoding in _DICTIONARY_ENCODINGS and dictionary is None:
                return f"{where}: its values index a dictionary the column chunk has not"
            if h.encoding not in _ENCODINGS:
                named = " (DELTA_BYTE_ARRAY)" if h.encoding == 7 else ""
                return (f"{where}: its values are in encoding {h.encoding}{named}, which the "
                        "verifier does not read")  # fmt: skip
            if h.levels_bytes > min(h.compressed_page_size, h.uncompressed_page_size):
                return f"{where}: its levels claim more bytes than the page holds ({kind})"
    return None
