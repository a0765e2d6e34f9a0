#!/usr/bin/env python3
"""Rebuilds fuzz/corpus/torch_save from the golden torch.save files: each seed is the archive's
data.pkl followed by the record table the torch_save fuzzer serves storages from
("\\0RECORDS\\0" then one "name size" line per record). Run from the repository root."""
import pathlib
import zipfile

root = pathlib.Path("fixtures/golden/torch_save")
out = pathlib.Path("fuzz/corpus/torch_save")
out.mkdir(parents=True, exist_ok=True)
for pt in sorted(root.glob("*.pt")):
    try:
        archive = zipfile.ZipFile(pt)
    except zipfile.BadZipFile:
        continue  # the deliberately truncated file
    names = archive.namelist()
    prefix = names[0].split("/")[0] + "/"
    pickle = archive.read(prefix + "data.pkl")
    table = "".join(f"{n[len(prefix):]} {archive.getinfo(n).file_size}\n"
                    for n in names if n.startswith(prefix + "data/"))
    (out / (pt.stem + ".pkl")).write_bytes(pickle + b"\0RECORDS\0" + table.encode())
