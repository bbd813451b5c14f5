"""The time, latitude and longitude axes of a variable, found as cf_xarray finds them.

The ops' defaults name the axes as most model output does (``dim="time"``, weighted_mean's
``dims=("lat", "lon")``). Where a variable has no dimension of that name (ERA5's ``valid_time``,
``latitude``, ``longitude``), :func:`resolve` looks for the one dimension coordinate whose
attributes say it is that axis, by the criteria of cf_xarray's ``cf.axes`` and ``cf.coordinates``
(``cf_xarray.criteria.coordinate_criteria``, as of cf_xarray 0.11, which takes them from MetPy):
``standard_name`` (or ``long_name``), ``_CoordinateAxisType``, ``axis``, ``cartesian_axis``,
``grads_dim`` and, for latitude and longitude, ``units``; for time also ``units`` of the form
"<units> since <date>" (CF conventions, section 4.4), which a coordinate keeps where its dates were
not decoded. cf_xarray is not a dependency of pipeline, so its criteria are written out here.

Latitude and longitude are looked for by their CF criteria first (``cf.coordinates``), then as
the Y and X axes (``cf.axes``), then by the name ``latitude`` or ``longitude``: the first of
these that finds any coordinate decides. Two dimensions found for one axis are refused, naming
both; so is none, naming what was looked for. An explicit name other than the default is used as
given (and refused where the variable lacks it).
"""

from __future__ import annotations

from typing import Any, Mapping

import xarray as xr

from ..errors import InputError

_LATITUDE_UNITS = ("degree_north", "degree_N", "degreeN", "degrees_north", "degrees_N", "degreesN")
_LONGITUDE_UNITS = ("degree_east", "degree_E", "degreeE", "degrees_east", "degrees_E", "degreesE")

# cf_xarray's coordinate_criteria for "time"/"T", "latitude", "Y", "longitude", "X"; long_name is
# matched against the standard_name values, as there
_TIME = {"standard_name": ("time",), "_CoordinateAxisType": ("Time",), "axis": ("T",), "cartesian_axis": ("T",),
         "grads_dim": ("t",)}
_LATITUDE = {"standard_name": ("latitude",), "units": _LATITUDE_UNITS, "_CoordinateAxisType": ("Lat",)}
_Y = {"standard_name": ("projection_y_coordinate", "grid_latitude", "projection_y_angular_coordinate"),
      "_CoordinateAxisType": ("GeoY",), "axis": ("Y",), "cartesian_axis": ("Y",), "grads_dim": ("y",)}
_LONGITUDE = {"standard_name": ("longitude",), "units": _LONGITUDE_UNITS, "_CoordinateAxisType": ("Lon",)}
_X = {"standard_name": ("projection_x_coordinate", "grid_longitude", "projection_x_angular_coordinate"),
      "_CoordinateAxisType": ("GeoX",), "axis": ("X",), "cartesian_axis": ("X",), "grads_dim": ("x",)}

ROLES = {"time": "time", "lat": "latitude", "lon": "longitude"}
"""The ops' default axis names, and the axis each stands for."""

_TIERS = {"time": (_TIME,), "latitude": (_LATITUDE, _Y), "longitude": (_LONGITUDE, _X)}


def _matches(name: str, attrs: Mapping[str, Any], criteria: Mapping[str, tuple]) -> list[str]:
    """The attributes of coordinate ``name`` that meet ``criteria``, as "key 'value'"."""
    found = []
    for key, expected in {**criteria, "long_name": criteria.get("standard_name", ())}.items():
        value = attrs.get(key)
        if isinstance(value, str) and value in expected:
            found.append(f"{key} {value!r}")
    if criteria is _TIME:
        units = attrs.get("units")
        if isinstance(units, str) and " since " in units:
            found.append(f"units {units!r}")
    return found


def _candidates(dims, coords: Mapping[str, Mapping], role: str) -> dict[str, list[str]]:
    """Dimension -> the attributes by which its coordinate is the ``role`` axis, by the first
    tier of criteria that finds any."""
    for criteria in _TIERS[role]:
        found = {d: _matches(d, coords[d], criteria) for d in dims if d in coords}
        found = {d: why for d, why in found.items() if why}
        if found:
            return found
    return {role: ["its name"]} if role != "time" and role in dims else {}


def _described(x) -> tuple[tuple[str, ...], dict[str, Mapping], str | None]:
    """Dimensions, coordinates' attributes and name of a DataArray or of a
    :class:`pipeline.ops.shapes.Meta`."""
    if isinstance(x, xr.DataArray):
        return tuple(map(str, x.dims)), {str(k): c.attrs for k, c in x.coords.items()}, x.name
    return tuple(x.dims), dict(x.coords), x.name


def find(x, role: str) -> list[str]:
    """The dimensions of ``x`` (a DataArray or a Meta) that are its ``role`` axis ("time",
    "latitude" or "longitude") by their coordinates' attributes."""
    dims, coords, _ = _described(x)
    return list(_candidates(dims, coords, role))


def resolve(x, dim: str, param: str = "dim") -> str:
    """``dim`` where ``x`` has that dimension or ``dim`` is not a default axis name (the op's
    checks then refuse a missing one); else the one dimension of ``x`` that is that axis by its
    CF attributes. InputError where two are, naming both; where none is, the dimension's
    absence is reported as before, with what was looked for."""
    dims, coords, name = _described(x)
    if dim in dims or dim not in ROLES:
        return dim
    role = ROLES[dim]
    found = _candidates(dims, coords, role)
    if len(found) == 1:
        return next(iter(found))
    listed = ", ".join(dims)
    if not found:
        looked = "standard_name 'time', axis 'T' or units '... since ...'" if role == "time" else (
            f"standard_name {role!r}, units {_LATITUDE_UNITS[3] if role == 'latitude' else _LONGITUDE_UNITS[3]!r} "
            f"or axis {'Y' if role == 'latitude' else 'X'!r}")
        raise InputError(
            f"variable {name!r} has no dimension {dim!r} (its dimensions: {listed}), and no dimension coordinate is "
            f"its {role} axis by CF attributes ({looked}); name the dimension with {param!r}"
        )
    which = "; ".join(f"{d!r} ({', '.join(why)})" for d, why in found.items())
    raise InputError(
        f"variable {name!r} has no dimension {dim!r}, and {len(found)} dimensions are its {role} axis by their "
        f"CF attributes: {which}; name the one to use with {param!r}"
    )


def resolve_dims(x, dims, param: str = "dims"):
    """:func:`resolve` for each of ``dims`` (one name or several), in the same form."""
    if isinstance(dims, str):
        return resolve(x, dims, param)
    return type(dims)(resolve(x, d, param) for d in dims) if isinstance(dims, (list, tuple)) else dims
