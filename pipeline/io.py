def open_dataset(*a,**k): pass
def write_zarr(*a,**k): pass
