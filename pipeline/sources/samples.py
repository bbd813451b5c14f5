"""Sample tables: per-sample variables (cohorts, traits, covariates) from a TSV or CSV file, for a
VCF Zarr store, whose VCF has none.

The file has a header. Its key is the column ``sample_id``, or the first column where none is so
named; every other column becomes a variable of dimension ``samples``, in the store's sample order:

- ``cohort`` (or ``sample_cohort``) becomes ``sample_cohort``, sgkit's cohort index (int64): text
  labels are numbered 0, 1, ... in order of first appearance and kept, in that order, as the
  variable's ``cohort_labels`` attribute; whole numbers are the indexes themselves. A missing value
  is -1, sgkit's "no cohort". The labels are not made ``cohorts_0``... coordinates: a filter that
  drops a whole cohort would leave them longer than the cohorts the statistics count.
- any other column holds numbers (traits, covariates) and becomes a float64 variable named
  ``sample_<column>`` (the column's name as it is where it already starts with ``sample_``);
  missing values are NaN.

Missing values are empty cells and ``NA``, ``NaN``, ``N/A``, ``.``. The delimiter is a tab for
``.tsv``, a comma for ``.csv``, and otherwise found from the first lines (tab, comma, semicolon).

Every problem is an InputError naming the file: a store sample the table lacks, an ID twice, no ID
of the store's, a value that is not a number, a column that would replace a variable the store has.
IDs of the table that the store lacks are only a warning.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import InputError

log = logging.getLogger(__name__)

ID_COLUMN = "sample_id"
COHORT_COLUMNS = ("cohort", "sample_cohort")
MISSING = ("", "NA", "NaN", "nan", "N/A", ".")
DELIMITERS = {".tsv": "\t", ".csv": ","}
SNIFFED = "\t,;"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHOWN = 5  # IDs named in a message


@dataclass(frozen=True)
class Column:
    """One variable of the table: its name in the dataset, the column it comes from, and its
    values in the table's row order (strings, as read)."""

    name: str
    column: str
    values: list[str]
    # a numeric column's values as float64 (NaN where missing), found once when the table is read
    numbers: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def cohort(self) -> bool:
        return self.name == "sample_cohort"


@dataclass(frozen=True)
class SampleTable:
    path: Path
    ids: list[str]
    columns: list[Column]

    @property
    def names(self) -> list[str]:
        """The variables the table adds."""
        return [c.name for c in self.columns]

    def kinds(self) -> dict[str, str]:
        """The dtype of each variable the table adds."""
        return {c.name: "int64" if c.cohort else "float64" for c in self.columns}


def _some(ids) -> str:
    ids = list(ids)
    shown = ", ".join(map(repr, ids[:SHOWN]))
    return f"{shown}, ... ({len(ids)} in all)" if len(ids) > SHOWN else shown


def read_table(path) -> SampleTable:
    """Read and check a sample table on its own (the store's samples are matched by :func:`variables`)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file (expected a sample table, TSV or CSV)" if not path.exists()
                         else f"{path}: not a file (expected a sample table, TSV or CSV)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a text file (UTF-8): {e.reason} at byte {e.start}") from None
    if not text.strip():
        raise InputError(f"{path}: empty file; expected a sample table with a header (sample_id and one column per variable)")
    sep = DELIMITERS.get(path.suffix.lower()) or _sniff(path, text)
    try:
        df = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    except (pd.errors.ParserError, ValueError) as e:
        raise InputError(f"{path}: not a table of {_name(sep)}-separated values: {e}") from None
    header = [str(c).strip() for c in df.columns]
    if len(header) < 2:
        raise InputError(f"{path}: one column ({header[0]!r}) when read as {_name(sep)}-separated values; expected the "
                         "sample IDs and at least one column of values (is the delimiter right?)")
    if any(c.startswith("Unnamed: ") or not c for c in header):
        raise InputError(f"{path}: a column has no name in the header (columns: {', '.join(map(repr, header))})")
    df.columns = header
    key = ID_COLUMN if ID_COLUMN in header else header[0]
    ids = _stripped(df[key])
    if not ids:
        raise InputError(f"{path}: no samples: the header has no rows below it")
    if "" in ids:
        raise InputError(f"{path}: row {ids.index('') + 2} has no sample ID (column {key!r})")
    seen, twice = set(), []
    for i in ids:
        if i in seen and i not in twice:
            twice.append(i)
        seen.add(i)
    if twice:
        raise InputError(f"{path}: sample IDs appear more than once (column {key!r}): {_some(twice)}")
    columns, names = [], {}
    for c in header:
        if c == key:
            continue
        name = "sample_cohort" if c in COHORT_COLUMNS else c if c.startswith("sample_") else f"sample_{c}"
        if not NAME.match(name):
            raise InputError(f"{path}: column {c!r}: expected a name of letters, digits and _ (it becomes the variable {name!r})")
        if name in names:
            raise InputError(f"{path}: columns {names[name]!r} and {c!r} would both be the variable {name!r}; keep one")
        names[name] = c
        column = Column(name, c, _stripped(df[c]))
        if not column.cohort:  # checked here, and kept for variables()
            column = replace(column, numbers=_numbers(path, column, ids))
        columns.append(column)
    return SampleTable(path, ids, columns)


def _stripped(series) -> list[str]:
    # tolist() first: iterating pandas' Arrow strings one by one cost 0.07 s at 25,000 samples
    return [s.strip() for s in series.tolist()]


def _name(sep: str) -> str:
    return {"\t": "tab", ",": "comma", ";": "semicolon"}.get(sep, repr(sep))


def _sniff(path: Path, text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()][:20]
    try:
        return csv.Sniffer().sniff("\n".join(lines), delimiters=SNIFFED).delimiter
    except csv.Error:
        raise InputError(f"{path}: could not tell the delimiter (expected tabs, commas or semicolons between columns, the "
                         "same number on every line; name the file .tsv or .csv to say which)") from None


def _numbers(path: Path, column: Column, ids: list[str]) -> np.ndarray:
    """A numeric column's values as float64, NaN where missing; InputError naming the first that is no number."""
    values = np.array(column.values, dtype=object)
    values[np.isin(values, MISSING)] = "nan"
    try:  # NumPy casts each string by Python's float(), in one loop in C
        return values.astype(np.float64)
    except ValueError:
        i = next(i for i, v in enumerate(values) if not _is_number(v))
    raise InputError(f"{path}: column {column.column!r}, sample {ids[i]!r}: {values[i]!r} is not a number (a column other "
                     f"than the IDs and the cohort holds numbers; missing values: empty, {', '.join(MISSING[1:])})")


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _cohorts(column: Column) -> tuple[np.ndarray, list[str] | None]:
    """The cohort indexes (-1 where missing), and the labels where the column holds text."""
    present = [v for v in column.values if v not in MISSING]
    if all(re.fullmatch(r"[+-]?\d+", v) for v in present):
        return np.array([int(v) if v not in MISSING else -1 for v in column.values], np.int64), None
    labels = list(dict.fromkeys(present))
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index.get(v, -1) for v in column.values], np.int64), labels


def variables(table: SampleTable, sample_ids, existing=()) -> dict[str, tuple[np.ndarray, dict]]:
    """The table's variables in the order of ``sample_ids`` (the store's): name -> (values, attrs).
    ``existing``: the store's variables, which the table may not replace. InputError naming the
    file where a store sample has no row, or no ID matches; IDs the store lacks are a warning."""
    path = table.path
    for c in table.columns:
        if c.name in existing:
            raise InputError(f"{path}: column {c.column!r} would replace the variable {c.name!r} the store already has; "
                             "rename or drop the column")
    sample_ids = [str(s) for s in sample_ids]
    row = {s: i for i, s in enumerate(table.ids)}
    missing = [s for s in sample_ids if s not in row]
    if len(missing) == len(sample_ids):
        raise InputError(f"{path}: none of the store's {len(sample_ids)} sample IDs is in the table (the store's: "
                         f"{_some(sample_ids)}; the table's: {_some(table.ids)})")
    if missing:
        raise InputError(f"{path}: {len(missing)} of the store's {len(sample_ids)} samples are not in the table: "
                         f"{_some(missing)}")
    extra = set(table.ids) - set(sample_ids)
    if extra:
        log.warning("%s: %d sample IDs of the table are not in the store, and are left out: %s", path, len(extra),
                    _some([i for i in table.ids if i in extra]), extra={"samples_table": str(path)})
    order = np.array([row[s] for s in sample_ids], np.intp)
    out = {}
    for c in table.columns:
        attrs = {"description": f"from column {c.column!r} of the sample table {path.name}"}
        if c.cohort:  # labels numbered among the store's samples, so that every cohort has some
            kept = np.sort(order)
            values, labels = _cohorts(Column(c.name, c.column, [c.values[i] for i in kept]))
            if labels is not None:
                attrs["cohort_labels"] = labels
            out[c.name] = (values[np.searchsorted(kept, order)], attrs)
        else:
            numbers = c.numbers if c.numbers is not None else _numbers(path, c, table.ids)
            out[c.name] = (numbers[order], attrs)
    return out


def attach(ds, table: SampleTable, existing=None):
    """``ds`` (a VCF Zarr store's Dataset, with ``sample_id``) with the table's variables added,
    as Dask arrays on the backend and in the sample chunks of its per-sample arrays (NumPy arrays
    where ``ds`` holds no Dask array: a store's metadata). ``existing``: the store's variables,
    which the table may not replace (default: ``ds``'s)."""
    import xarray as xr

    from .. import backend as B

    if "sample_id" not in ds.variables:
        raise InputError(f"{table.path}: the store has no sample_id to match the table's IDs against")
    ids = ds["sample_id"].data
    if hasattr(ids, "__dask_graph__"):
        from ..exec.compute import compute

        # not dask's compute, which imports distributed to look for a client (0.23 s of an open)
        ids = compute(ids)
    ids = np.asarray(ids, dtype=object)  # strings live on the host
    # the chunks and backend of the store's per-sample arrays, so that blocks line up in the steps
    like = next((v for v in ds.data_vars.values() if "samples" in v.dims and hasattr(v.data, "__dask_graph__")
                 and v.dtype.kind in "iufb"), None)
    new = {}
    for name, (values, attrs) in variables(table, ids, set(map(str, ds.variables)) if existing is None else existing).items():
        data = values
        if like is not None:
            import dask.array as da

            data = da.from_array(values, chunks=(like.data.chunks[like.dims.index("samples")],))
            data = B.to_backend(data, B.backend_of(like))
        new[name] = xr.Variable(("samples",), data, attrs)
    return ds.assign(new)


__all__ = ["SampleTable", "attach", "read_table", "variables"]
