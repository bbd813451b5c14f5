"""Blosc chunks (Zarr v2 ``blosc`` compressor, Zarr v3 ``blosc`` codec) decoded on the GPU.

Most public Zarr v2 archives are Blosc (ERA5-style: lz4 and byte shuffle), so is Zarr v3's
BloscCodec (zstd; byte shuffle, or bit shuffle for one-byte types) and bio2zarr's default (zstd,
bit shuffle). A Blosc chunk (c-blosc 1.x, format version 2) is a 16-byte header::

    version, versionlz, flags, typesize (1 byte each), nbytes, blocksize, cbytes (int32 each)

then, unless the chunk is *memcpyed* (its bytes stored as they are after the header), a table of
``nblocks`` int32 block starts. Each block (``blocksize`` bytes, the last one the remainder) is
either split into ``typesize`` streams or kept as one; each stream is an int32 compressed size
and the stream, stored raw where that size equals its decoded size. Streams are independent
LZ4 blocks, zstd frames, zlib streams, blosclz or snappy streams, so all the streams of all the
chunks of a Dask block decode in one nvCOMP batch per algorithm; one kernel launch then
unshuffles every block (:mod:`pipeline.kernels.shuffle`). Flags: bit 0 byte shuffle, bit 1
memcpyed, bit 2 bit shuffle, bit 3 reserved, bit 4 "do not split", bits 5-7 the compressor
(0 blosclz, 1 lz4 and lz4hc, 2 snappy, 3 zlib, 4 zstd). Without the "do not split" flag a block
is split when ``typesize <= 16`` and it holds at least 128 elements and is not the last,
remainder, block: the rule of c-blosc's decoder, which also reads chunks written before the
flag existed.

nvCOMP has no decoder for blosclz and snappy: chunks using them are decoded by numcodecs on
the host (once said, per array) and copied.

:func:`parse` and :func:`decode_chunk_host` are plain Python and NumPy, the CPU twin of the GPU
decode, tested bit for bit against numcodecs' Blosc on every machine.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import DecodeError
from ..kernels import shuffle

HEADER = 16
VERSION = 2  # c-blosc 1.x's format version; its decoder refuses any other
MAX_SPLITS = 16
MIN_BUFFERSIZE = 128
COMPRESSORS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}
NVCOMP_ALGORITHMS = {"lz4": "LZ4", "zstd": "Zstd", "zlib": "Deflate"}  # compressor -> nvCOMP
ZLIB_HEADER, ZLIB_TRAILER = 2, 4  # around the raw deflate stream that nvCOMP decodes
DEFLATE_ALIGNMENT = 4  # bytes: where nvCOMP's Deflate wants each input stream to start
STREAM_COLUMNS = ("src", "csize", "dst", "dsize", "raw")
BLOSCLZ_MAX_DISTANCE = 8191


@dataclass(frozen=True)
class BloscChunk:
    """One Blosc chunk, parsed.

    ``shuffle`` is what decoding applies ("none", "byte" or "bit"): "none" for a memcpyed chunk
    and for byte shuffle of one-byte types, as c-blosc decides. ``streams`` is an int64 array of
    rows (src offset in the chunk, compressed size, dst offset in the chunk's bytes before
    unshuffling, decoded size, stored raw). ``blocks`` is an int64 array of rows (offset, nbytes),
    the units that unshuffling transposes.
    """

    nbytes: int
    typesize: int
    blocksize: int
    shuffle: str
    memcpyed: bool
    compressor: str
    streams: np.ndarray
    blocks: np.ndarray
    raw: bytes | None = dataclasses.field(default=None, repr=False)  # kept by header() where the host decodes it

    @property
    def gpu(self) -> bool:
        """Whether nvCOMP decodes it (a memcpyed chunk is only copied)."""
        return self.memcpyed or self.compressor in NVCOMP_ALGORITHMS


def parse(blob) -> BloscChunk:
    """The layout of the Blosc chunk ``blob`` (bytes or a uint8 array). Raises DecodeError for a
    chunk that is truncated, malformed or of another format version."""
    view = memoryview(blob).cast("B") if not isinstance(blob, np.ndarray) else memoryview(blob.reshape(-1).view(np.uint8))
    if len(view) < HEADER:
        raise DecodeError(f"Blosc chunk of {len(view)} bytes: shorter than its 16-byte header")
    version, _, flags, typesize = view[0], view[1], view[2], view[3]
    nbytes, blocksize, cbytes = struct.unpack_from("<iii", view, 4)
    if version != VERSION:
        raise DecodeError(f"Blosc chunk of format version {version}; expected {VERSION} (c-blosc 1.x)")
    if flags & 0x08:
        raise DecodeError(f"Blosc chunk with reserved flag bit 3 set (flags {flags:#04x})")
    if cbytes > len(view) or cbytes < HEADER:
        raise DecodeError(f"Blosc chunk truncated or corrupt: its header says {cbytes} bytes, it has {len(view)}")
    code = flags >> 5
    if code not in COMPRESSORS:
        raise DecodeError(f"Blosc chunk with unknown compressor code {code}")
    compressor = COMPRESSORS[code]
    memcpyed = bool(flags & 0x02)
    empty = np.empty((0, len(STREAM_COLUMNS)), dtype=np.int64)
    if nbytes < 0 or (nbytes and (blocksize <= 0 or typesize == 0)):
        raise DecodeError(f"Blosc chunk header corrupt: nbytes {nbytes}, blocksize {blocksize}, typesize {typesize}")
    if nbytes == 0:
        return BloscChunk(0, typesize, blocksize, "none", memcpyed, compressor, empty, np.empty((0, 2), np.int64))
    nblocks = -(-nbytes // blocksize)
    sizes = np.full(nblocks, blocksize, dtype=np.int64)
    sizes[-1] = nbytes - (nblocks - 1) * blocksize
    blocks = np.stack([np.arange(nblocks, dtype=np.int64) * blocksize, sizes], axis=1)
    if memcpyed:
        if cbytes != nbytes + HEADER:
            raise DecodeError(f"memcpyed Blosc chunk of {cbytes} bytes for {nbytes} values bytes")
        streams = np.array([[HEADER, nbytes, 0, nbytes, 1]], dtype=np.int64)
        return BloscChunk(nbytes, typesize, blocksize, "none", True, compressor, streams, blocks)
    if HEADER + 4 * nblocks > cbytes:
        raise DecodeError(f"Blosc chunk truncated: {nblocks} block starts do not fit in {cbytes} bytes")
    mode = "byte" if flags & 0x01 and typesize > 1 else "bit" if flags & 0x04 else "none"
    starts = np.frombuffer(view, dtype="<i4", count=nblocks, offset=HEADER).tolist()
    split_allowed = not flags & 0x10 and typesize <= MAX_SPLITS
    rows = []
    for j, (start, bsize) in enumerate(zip(starts, sizes.tolist())):
        leftover = j == nblocks - 1 and nbytes % blocksize
        nsplits = typesize if split_allowed and bsize // typesize >= MIN_BUFFERSIZE and not leftover else 1
        if bsize % nsplits:
            raise DecodeError(f"Blosc block of {bsize} bytes does not split into {nsplits} streams")
        rows += _block_streams(view, cbytes, start, j * blocksize, bsize // nsplits, nsplits)
    streams = np.array(rows, dtype=np.int64).reshape(-1, len(STREAM_COLUMNS))
    return BloscChunk(nbytes, typesize, blocksize, mode, False, compressor, streams, blocks)


def header(blob) -> BloscChunk:
    """:func:`parse` of ``blob`` for :func:`decode_frames` later, when its memory may hold other
    bytes: with a copy of them kept where the host decodes the chunk (a compressor nvCOMP lacks)."""
    chunk = parse(blob)
    return chunk if chunk.gpu else dataclasses.replace(chunk, raw=bytes(memoryview(blob).cast("B")))


SHUFFLES = ("none", "byte", "bit")  # Batch.shuffle's codes
CODES = {name: code for code, name in COMPRESSORS.items()}


@dataclass(frozen=True)
class Batch:
    """Many Blosc chunks parsed at once, as tables: chunk ``k``'s header at row ``k`` of
    ``nbytes``, ``typesize``, ``shuffle`` (an index of :data:`SHUFFLES`) and ``compressor`` (a
    code of :data:`COMPRESSORS`), and the ``streams`` and ``blocks`` of every chunk, in order,
    each row led by its chunk's index (then :attr:`BloscChunk.streams`' or ``blocks``' columns).
    Every chunk of a batch is one that nvCOMP decodes or copies (:attr:`BloscChunk.gpu`)."""

    nbytes: np.ndarray
    typesize: np.ndarray
    shuffle: np.ndarray
    compressor: np.ndarray
    streams: np.ndarray
    blocks: np.ndarray

    def __len__(self) -> int:
        return len(self.nbytes)

    @classmethod
    def of(cls, chunks: list[BloscChunk]) -> Batch:
        """The chunks parsed one by one (:func:`parse`), as one batch."""
        def led(k, rows):
            return np.concatenate([np.full((len(rows), 1), k, np.int64), rows], axis=1)

        return cls(np.array([c.nbytes for c in chunks], np.int64), np.array([c.typesize for c in chunks], np.int64),
                   np.array([SHUFFLES.index(c.shuffle) for c in chunks], np.int64),
                   np.array([CODES[c.compressor] for c in chunks], np.int64),
                   np.concatenate([led(k, c.streams) for k, c in enumerate(chunks)] + [np.empty((0, 6), np.int64)]),
                   np.concatenate([led(k, c.blocks) for k, c in enumerate(chunks)] + [np.empty((0, 3), np.int64)]))

    def take(self, start: int, stop: int) -> Batch:
        """Chunks ``start`` to ``stop`` (rows of each table are in their chunks' order)."""
        if (start, stop) == (0, len(self)):
            return self

        def rows(table):
            lo, hi = np.searchsorted(table[:, 0], [start, stop])
            out = table[lo:hi].copy()
            out[:, 0] -= start
            return out

        return Batch(self.nbytes[start:stop], self.typesize[start:stop], self.shuffle[start:stop],
                     self.compressor[start:stop], rows(self.streams), rows(self.blocks))

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        if len(batches) == 1:
            return batches[0]
        firsts = np.cumsum([0] + [len(b) for b in batches[:-1]])

        def led(name):  # one addition over the joined table: NumPy lets go of the GIL for each large one
            table = np.concatenate([getattr(b, name) for b in batches])
            table[:, 0] += np.repeat(firsts, [len(getattr(b, name)) for b in batches])
            return table

        return Batch(*(np.concatenate([getattr(b, f) for b in batches]) for f in ("nbytes", "typesize", "shuffle", "compressor")),
                     led("streams"), led("blocks"))


def parse_many(buffer: np.ndarray, offsets, sizes) -> Batch | None:
    """The Blosc chunks of ``sizes[k]`` bytes at byte ``offsets[k]`` of the uint8 array ``buffer``,
    parsed at once: :func:`parse`'s tables for every chunk, from a few NumPy operations on all of
    them, one more a stream of a block (Blosc walks a block's streams by their size prefixes).

    Parsing one chunk in Python took 60 us on 2 cores: for 18.2 GB of ERA5-style chunks (4,380
    files of 2.6 MB) it held the GIL 0.2-0.3 s, on the threads that also keep the reads going.
    Returns None where any chunk is not one that :func:`parse` reads plainly (memcpyed, empty, a
    compressor nvCOMP lacks, or anything :func:`parse` refuses): the caller parses those one by
    one, and :func:`parse` gives the error."""
    buf = buffer.reshape(-1).view(np.uint8) if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, np.uint8)
    offsets, sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
    if len(offsets) == 0 or (sizes < HEADER).any() or (offsets + sizes > len(buf)).any():
        return None if len(offsets) else Batch.of([])
    head = buf[offsets[:, None] + np.arange(HEADER)]
    version, flags, typesize = head[:, 0], head[:, 2].astype(np.int64), head[:, 3].astype(np.int64)
    nbytes, blocksize, cbytes = head[:, 4:].copy().view("<i4").astype(np.int64).T
    code = flags >> 5
    gpu = (code == CODES["lz4"]) | (code == CODES["zstd"]) | (code == CODES["zlib"])  # NVCOMP_ALGORITHMS
    if not ((version == VERSION) & (flags & 0x0A == 0) & gpu & (cbytes >= HEADER) & (cbytes <= sizes)
            & (nbytes > 0) & (blocksize > 0) & (typesize > 0)).all():
        return None
    nblocks = -(-nbytes // blocksize)
    if (HEADER + 4 * nblocks > cbytes).any():
        return None
    shuffle = np.where((flags & 0x01 != 0) & (typesize > 1), 1, np.where(flags & 0x04 != 0, 2, 0))
    # blocks: chunk, index in the chunk, size, split into how many streams (c-blosc's rule, as parse)
    chunk = np.repeat(np.arange(len(offsets)), nblocks)
    j = np.arange(len(chunk)) - np.repeat(np.cumsum(nblocks) - nblocks, nblocks)
    last = j == nblocks[chunk] - 1
    bsize = np.where(last, nbytes[chunk] - j * blocksize[chunk], blocksize[chunk])
    ts = typesize[chunk]
    split = (flags[chunk] & 0x10 == 0) & (ts <= MAX_SPLITS) & (bsize // ts >= MIN_BUFFERSIZE) & ~(last & (nbytes[chunk] % blocksize[chunk] != 0))
    nsplits = np.where(split, ts, 1)
    if (bsize % nsplits).any():
        return None
    neblock = bsize // nsplits
    # streams: the s-th stream of every block at once, each after the previous one's prefix and bytes
    first = np.cumsum(nsplits) - nsplits
    src, csize = np.empty(int(nsplits.sum()), np.int64), np.empty(int(nsplits.sum()), np.int64)
    pos, end = _int32_at(buf, offsets[chunk] + HEADER + 4 * j), cbytes[chunk]
    for s in range(int(nsplits.max())):
        b = np.flatnonzero(nsplits > s)
        at = pos[b]
        if ((at < HEADER) | (at + 4 > end[b])).any():
            return None
        size = _int32_at(buf, offsets[chunk[b]] + at)
        if ((size < 0) | (at + 4 + size > end[b])).any():
            return None
        src[first[b] + s], csize[first[b] + s] = at + 4, size
        pos[b] = at + 4 + size
    within = np.arange(len(src)) - np.repeat(first, nsplits)
    dsize = np.repeat(neblock, nsplits)
    streams = np.stack([np.repeat(chunk, nsplits), src, csize, np.repeat(j * blocksize[chunk], nsplits) + within * dsize,
                        dsize, (csize == dsize).astype(np.int64)], axis=1)
    blocks = np.stack([chunk, j * blocksize[chunk], bsize], axis=1)
    return Batch(nbytes, typesize, shuffle, code, streams, blocks)


def _int32_at(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian int32 at each byte ``at`` of ``buf``, as int64: from the four int32
    views of ``buf`` (one for each alignment), so that each operation has only ``len(at)``
    elements (NumPy lets go of the GIL for operations of more than 500, and getting it back
    among the reader's threads took 1-5 ms each)."""
    out = np.empty(len(at), np.int64)
    shift = at & 3
    for r in range(4):
        pick = shift == r
        if pick.any():
            out[pick] = buf[r:r + (len(buf) - r) // 4 * 4].view("<i4")[(at[pick] - r) >> 2]
    return out


def _block_streams(view, cbytes: int, offset: int, dst: int, neblock: int, nsplits: int) -> list:
    """The stream rows of one block, whose first stream's size prefix is at ``offset``."""
    rows = []
    for s in range(nsplits):
        if offset < HEADER or offset + 4 > cbytes:
            raise DecodeError(f"Blosc chunk corrupt: a stream starts at byte {offset} of {cbytes}")
        (csize,) = struct.unpack_from("<i", view, offset)
        offset += 4
        if csize < 0 or offset + csize > cbytes:
            raise DecodeError(f"Blosc chunk truncated or corrupt: a stream of {csize} bytes at byte {offset} of {cbytes}")
        rows.append((offset, csize, dst + s * neblock, neblock, int(csize == neblock)))
        offset += csize
    return rows


# --- the CPU twin ---------------------------------------------------------------------------------


def decode_chunk_host(blob) -> np.ndarray:
    """The chunk's decoded bytes (uint8), from :func:`parse`, each stream decoded by its
    compressor's own library and unshuffled by the NumPy twins of the GPU kernels."""
    chunk = parse(blob)
    src = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) else blob.reshape(-1).view(np.uint8)
    if chunk.compressor == "snappy" and not chunk.memcpyed:
        raise DecodeError("Blosc chunk compressed with snappy, which no library here decodes")
    scratch = np.empty(chunk.nbytes, dtype=np.uint8)
    for s, csize, d, dsize, raw in chunk.streams.tolist():
        piece = src[s:s + csize]
        scratch[d:d + dsize] = piece if raw else _decompress(chunk.compressor, piece, dsize)
    return unshuffle(chunk, scratch)


def unshuffle(chunk: BloscChunk, scratch: np.ndarray) -> np.ndarray:
    """A chunk's decoded streams (``scratch``) unshuffled block by block, by the units the device
    uses (:func:`device_plan`)."""
    if chunk.shuffle == "none":
        return scratch
    zero = np.zeros(1, np.int64)
    units = device_plan(Batch.of([chunk]), zero, zero, chunk.nbytes).units[chunk.shuffle]
    fn = shuffle.byte_unshuffle_cpu if chunk.shuffle == "byte" else shuffle.bit_unshuffle_cpu
    return fn(scratch, np.empty_like(scratch), units)


def _decompress(compressor: str, piece: np.ndarray, size: int) -> np.ndarray:
    if compressor == "lz4":  # a raw LZ4 block: numcodecs' LZ4 takes it after its size prefix
        import numcodecs

        out = numcodecs.LZ4().decode(struct.pack("<i", size) + piece.tobytes())
    elif compressor == "zstd":
        import numcodecs

        out = numcodecs.Zstd().decode(piece.tobytes())
    elif compressor == "zlib":
        import zlib

        out = zlib.decompress(piece.tobytes())
    else:
        out = blosclz_decompress(piece.tobytes(), size)
    out = np.frombuffer(out, dtype=np.uint8)
    if out.size != size:
        raise DecodeError(f"a {compressor} stream of a Blosc chunk decoded to {out.size} bytes, not {size}")
    return out


def blosclz_decompress(src: bytes, size: int) -> bytes:
    """One blosclz stream decoded (c-blosc 1.x's ``blosclz_decompress``, step by step): tokens
    of literals (control byte < 32: that many plus one bytes follow) and matches (length in the
    top three bits, extended by bytes while 255; distance from the low five bits and one more
    byte, or two more beyond 8191)."""
    out = bytearray()
    n, ip = len(src), 1
    if n == 0:
        return b""
    ctrl = src[0] & 31
    while True:
        if ctrl >= 32:
            length, ofs = (ctrl >> 5) - 1, (ctrl & 31) << 8
            if length == 6:
                while True:
                    if ip + 1 >= n:
                        raise DecodeError("blosclz stream truncated in a match length")
                    code = src[ip]
                    ip += 1
                    length += code
                    if code != 255:
                        break
            elif ip + 1 >= n:
                raise DecodeError("blosclz stream truncated in a match")
            code = src[ip]
            ip += 1
            length += 3
            op = len(out)
            ref = op - ofs - code
            if code == 255 and ofs == 31 << 8:
                if ip + 1 >= n:
                    raise DecodeError("blosclz stream truncated in a far match")
                ref = op - ((src[ip] << 8) + src[ip + 1]) - BLOSCLZ_MAX_DISTANCE
                ip += 2
            if op + length > size or ref - 1 < 0:
                raise DecodeError("blosclz match outside the block")
            if ip >= n:  # as c-blosc: a stream never ends on a match
                break
            ctrl = src[ip]
            ip += 1
            ref -= 1
            distance = op - ref
            if distance >= length:
                out += out[ref:ref + length]
            else:  # overlapping: the last ``distance`` bytes repeated
                out += (out[ref:op] * (-(-length // distance)))[:length]
        else:
            ctrl += 1
            if len(out) + ctrl > size or ip + ctrl > n:
                raise DecodeError("blosclz literal run outside the block")
            out += src[ip:ip + ctrl]
            ip += ctrl
            if ip >= n:
                break
            ctrl = src[ip]
            ip += 1
    return bytes(out)


# --- the GPU decode of a batch of chunks ----------------------------------------------------------


def decode_frames(root: str, hosts, dev, src_offsets, dst, dst_offsets, nbytes: int) -> None:
    """Decode Blosc chunks on this task's stream: chunk ``k`` lies at ``src_offsets[k]`` of the
    device bytes ``dev`` and decodes to the ``nbytes`` bytes at byte ``dst_offsets[k]`` of the
    CuPy array ``dst``. ``hosts`` says what each chunk is, in order: its host bytes (whose header
    is read here), its :func:`header`, or a :class:`Batch` of the next ``len(batch)`` chunks.

    Every stream of every chunk decodes in one nvCOMP batch per algorithm (streams stored raw
    are copied by one kernel launch) straight into ``dst`` for chunks without shuffle, or else
    into a scratch buffer, from which one launch per shuffle mode unshuffles every block into
    ``dst``. Chunks of compressors that nvCOMP does not decode are decoded on the host.
    """
    src_offsets, dst_offsets = np.asarray(src_offsets, np.int64), np.asarray(dst_offsets, np.int64)
    batches, index, run, on_host = [], [], [], []
    k = 0
    for h in hosts:
        if isinstance(h, Batch):
            batches.append(h)
            index.append(np.arange(k, k + len(h)))
            k += len(h)
            continue
        c = h if isinstance(h, BloscChunk) else parse(h)
        if c.nbytes != nbytes:
            raise DecodeError(f"{root}: a Blosc chunk holds {c.nbytes} bytes, expected {nbytes}")
        if c.gpu:
            run.append((k, c))
        else:
            on_host.append((k, c, h))
        k += 1
    if run:
        batches.append(Batch.of([c for _, c in run]))
        index.append(np.array([i for i, _ in run], np.int64))
    flat = dst.reshape(-1).view(np.uint8)
    if on_host:
        _decode_on_host(root, [c.raw if c.raw is not None else h for _, c, h in on_host], [c for _, c, _ in on_host],
                        flat, [int(dst_offsets[i]) for i, _, _ in on_host], nbytes)
    if batches:
        batch, index = Batch.concat(batches), np.concatenate(index)
        if (batch.nbytes != nbytes).any():
            raise DecodeError(f"{root}: a Blosc chunk holds {int(batch.nbytes[batch.nbytes != nbytes][0])} bytes, expected {nbytes}")
        _decode_on_device(device_plan(batch, src_offsets[index], dst_offsets[index], nbytes), dev, flat)


@dataclass(frozen=True)
class DevicePlan:
    """What the device does for a :class:`Batch`: ``streams`` (rows of :data:`STREAM_COLUMNS`,
    offsets in the device buffers) decode into ``flat`` (the destination's bytes), or into a
    scratch buffer of ``scratch`` bytes where ``into_scratch``, by the compressor of code
    ``algorithm``; then the units of :mod:`pipeline.kernels.shuffle` of each shuffle mode
    (``units``, "byte" and "bit") go from the scratch buffer into place."""

    streams: np.ndarray
    into_scratch: np.ndarray
    algorithm: np.ndarray
    scratch: int
    units: dict


def device_plan(batch: Batch, src_offsets: np.ndarray, dst_offsets: np.ndarray, nbytes: int) -> DevicePlan:
    """Chunk ``k`` of ``batch`` at ``src_offsets[k]`` of the device's compressed bytes, decoded to
    ``dst_offsets[k]``: the tables of :class:`DevicePlan`, from NumPy operations on whole tables
    (plain NumPy, so that every machine checks them by decoding on the host)."""
    shuffled = batch.shuffle != 0
    scratch_base = (np.cumsum(shuffled) - 1) * nbytes
    c = batch.streams[:, 0]
    into = shuffled[c]
    streams = batch.streams[:, 1:].copy()
    streams[:, 0] += src_offsets[c]
    streams[:, 2] += np.where(into, scratch_base[c], dst_offsets[c])
    units = {}
    for code, mode in enumerate(SHUFFLES[1:], start=1):
        rows = batch.blocks[batch.shuffle[batch.blocks[:, 0]] == code]
        if len(rows):
            b = rows[:, 0]
            units[mode] = np.stack([rows[:, 1] + scratch_base[b], rows[:, 1] + dst_offsets[b], rows[:, 2], batch.typesize[b]], axis=1)
    return DevicePlan(streams, into, batch.compressor[c], int(shuffled.sum()) * nbytes, units)


def _decode_on_device(plan: DevicePlan, dev, flat) -> None:
    import cupy as cp

    from . import nvcomp
    from .streams import current

    scratch = cp.empty(max(1, plan.scratch), dtype=np.uint8)
    current().keep.append(scratch)  # freed only once the stream is synchronized
    streams, raw_rows = plan.streams, plan.streams[:, 4] == 1
    for target, where in ((flat, ~plan.into_scratch), (scratch, plan.into_scratch)):
        raw = where & raw_rows
        if raw.any():
            rows = streams[raw]
            units = np.stack([rows[:, 0], rows[:, 2], rows[:, 3], np.ones(len(rows), np.int64)], axis=1)
            shuffle.copy_units_gpu(dev, target, _device_table(units), int(rows[:, 3].max()))
        for name, nv_name in NVCOMP_ALGORITHMS.items():
            rows = streams[where & ~raw_rows & (plan.algorithm == CODES[name])]
            if len(rows):
                src, size, source = rows[:, 0], rows[:, 1], dev
                if name == "zlib":  # nvCOMP decodes the deflate stream inside the zlib wrapper
                    src, size = src + ZLIB_HEADER, size - ZLIB_HEADER - ZLIB_TRAILER
                    source, src = _aligned(dev, src, size)
                nvcomp.decode_batch(nv_name, source, src, size, target, rows[:, 2], rows[:, 3])
    for mode, kernel in (("byte", shuffle.byte_unshuffle_gpu), ("bit", shuffle.bit_unshuffle_gpu)):
        if mode in plan.units:
            table = plan.units[mode]
            kernel(scratch, flat, _device_table(table), int(table[:, 2].max()))


def _aligned(dev, src, size, alignment: int = DEFLATE_ALIGNMENT):
    """Streams of ``dev`` at ``src`` (``size`` bytes each) gathered into a new device buffer where
    each starts at a multiple of ``alignment``: nvCOMP's Deflate refuses input that is not 4-byte
    aligned, and a zlib stream's deflate data start 2 bytes into it. Returns (buffer, offsets)."""
    import cupy as cp

    from .streams import current

    room = -(-size // alignment) * alignment
    offsets = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
    out = cp.empty(max(1, int(room.sum())), dtype=np.uint8)
    current().keep.append(out)
    units = np.stack([src, offsets, size, np.ones(len(src), np.int64)], axis=1).astype(np.int64)
    shuffle.copy_units_gpu(dev, out, _device_table(units), int(size.max()))
    return out, offsets


def _device_table(table: np.ndarray):
    """An int64 table on the device, copied from pinned memory on this task's stream without
    waiting (a copy from pageable memory would wait for the stream's earlier work)."""
    import cupy as cp
    import cupyx

    from .streams import current

    host = cupyx.empty_pinned(table.shape, dtype=np.int64)
    host[...] = table
    out = cp.empty(table.shape, dtype=np.int64)
    out.set(host, stream=current().stream)
    current().keep.append((host, out))
    return out


def _decode_on_host(root: str, hosts, chunks, flat, dst_offsets, nbytes: int) -> None:
    """Chunks whose compressor nvCOMP does not decode: numcodecs into pinned memory, then an
    asynchronous copy each."""
    import cupyx
    import numcodecs

    from .streams import current

    for name in sorted({c.compressor for c in chunks}):
        _warn_once(f"{root}: Blosc chunks compressed with {name}, which nvCOMP does not decode, are decoded on the CPU")
    staged = cupyx.empty_pinned((len(hosts), nbytes), dtype=np.uint8)
    codec = numcodecs.Blosc()
    stream = current().stream
    for k, (blob, offset) in enumerate(zip(hosts, dst_offsets)):
        try:
            codec.decode(blob, out=staged[k])
        except RuntimeError as e:
            raise DecodeError(f"{root}: numcodecs could not decode a Blosc chunk ({e})") from e
        flat[offset:offset + nbytes].set(staged[k], stream=stream)
    current().keep.append(staged)


@functools.cache
def _warn_once(message: str) -> None:
    """A RuntimeWarning for the caller's caller, shown once per place (Python's default filter);
    the GPU readers' one way to say that part of a store is decoded on the CPU."""
    warnings.warn(message, RuntimeWarning, stacklevel=3)
