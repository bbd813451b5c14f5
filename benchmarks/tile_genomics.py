"""A large VCF Zarr store made fast: a simulated store repeated ``--reps`` times along variants.

Simulating 50 GB of genotypes with msprime and writing them with bio2zarr takes about half an hour
on one core (30 MB/s measured on the GPU machine); a scaling benchmark needs the bytes, not new
genealogies. This copies each chunk file of every ``variants`` array of a store that
``pipeline demo --kind genomics`` wrote (bio2zarr's layout and codecs) ``--reps`` times under new
chunk indices, so every chunk in the copy is one that bio2zarr compressed, and the arrays along
samples are copied once. ``variant_position`` is the one array rewritten: each repeat is shifted
past the previous one, so positions keep increasing. Ops that depend only on the bytes' volume
(reads, decoding, PCA's and GWAS's matrix products) cost what they would on a simulated store of
that size; results repeat the source's, which the benchmark's checks across GPU counts do not
mind.

    python benchmarks/tile_genomics.py SOURCE DEST --reps 125

The source's variant count must be a multiple of its variant chunk (``pipeline demo --kind
genomics --variants`` with a multiple of 1,000), so that the repeats start on chunk boundaries.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

META = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}


def _array_meta(path: Path) -> tuple[int, dict, list]:
    """(zarr format, metadata, dimension names) of the array at ``path``."""
    if (path / ".zarray").exists():
        meta = json.loads((path / ".zarray").read_text())
        attrs = json.loads((path / ".zattrs").read_text()) if (path / ".zattrs").exists() else {}
        return 2, meta, attrs.get("_ARRAY_DIMENSIONS", [])
    meta = json.loads((path / "zarr.json").read_text())
    return 3, meta, meta.get("dimension_names") or []


def _chunk_files(path: Path, fmt: int, meta: dict) -> list[tuple[Path, list[str]]]:
    """Each chunk file and its key's parts (the first is the index along variants)."""
    if fmt == 2:
        sep = meta.get("dimension_separator", ".")
        files = [p for p in path.rglob("*") if p.is_file() and p.name not in META]
        return [(p, str(p.relative_to(path)).replace("/", sep).split(sep)) for p in files]
    encoding = meta["chunk_key_encoding"]
    sep = encoding.get("configuration", {}).get("separator", "/")
    root = path / "c" if encoding["name"] == "default" else path
    files = [p for p in root.rglob("*") if p.is_file() and p.name not in META]
    return [(p, str(p.relative_to(root)).replace("/", sep).split(sep)) for p in files]


def _key_path(path: Path, fmt: int, meta: dict, parts: list[str]) -> Path:
    if fmt == 2:
        sep = meta.get("dimension_separator", ".")
        return path / sep.join(parts) if sep == "." else path.joinpath(*parts)
    encoding = meta["chunk_key_encoding"]
    sep = encoding.get("configuration", {}).get("separator", "/")
    root = path / "c" if encoding["name"] == "default" else path
    return root / sep.join(parts) if sep != "/" else root.joinpath(*parts)


def _tile_array(src: Path, dst: Path, reps: int) -> int:
    """Copy the array ``src`` to ``dst`` repeated ``reps`` times along its first dimension;
    returns the bytes written."""
    fmt, meta, dims = _array_meta(src)
    shape = meta["shape"]
    chunk = meta["chunks"][0] if fmt == 2 else meta["chunk_grid"]["configuration"]["chunk_shape"][0]
    if shape[0] % chunk:
        raise SystemExit(f"{src}: {shape[0]} variants are not a multiple of the variant chunk {chunk}")
    n_chunks = shape[0] // chunk
    dst.mkdir(parents=True)
    for name in META:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    meta["shape"] = [shape[0] * reps, *shape[1:]]
    (dst / (".zarray" if fmt == 2 else "zarr.json")).write_text(json.dumps(meta, indent=4))
    written = 0
    for file, parts in _chunk_files(src, fmt, meta):
        data = file.read_bytes()
        for r in range(reps):
            out = _key_path(dst, fmt, meta, [str(int(parts[0]) + r * n_chunks), *parts[1:]])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            written += len(data)
    return written


def tile(src: Path, dst: Path, reps: int) -> dict:
    import numpy as np
    import zarr

    if dst.exists():
        raise SystemExit(f"{dst} exists")
    t = time.perf_counter()
    dst.mkdir(parents=True)
    for name in META | {".pipeline.json"}:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    written = 0
    for array in sorted(p for p in src.iterdir() if p.is_dir()):
        _, _, dims = _array_meta(array)
        if dims[:1] == ["variants"]:
            written += _tile_array(array, dst / array.name, reps)
        else:
            shutil.copytree(array, dst / array.name)
    # positions increase across the repeats: each is shifted past the last position of the source
    group = zarr.open_group(str(dst), mode="r+", use_consolidated=False)
    pos = np.asarray(zarr.open_group(str(src), mode="r", use_consolidated=False)["variant_position"][:])
    span = int(pos.max()) + 1
    group["variant_position"][:] = np.concatenate([pos + r * span for r in range(reps)])
    zarr.consolidate_metadata(str(dst))
    genotypes = group["call_genotype"]
    return {"store": str(dst), "call_genotype_shape": list(genotypes.shape), "genotype_bytes": int(genotypes.nbytes),
            "bytes_written": written, "seconds": round(time.perf_counter() - t, 1)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("dest")
    ap.add_argument("--reps", type=int, required=True)
    args = ap.parse_args(argv)
    out = tile(Path(args.source), Path(args.dest), args.reps)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
