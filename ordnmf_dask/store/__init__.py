"""The zarr block store: its layout, atomic writes, block reads, id maps and chunk files."""
