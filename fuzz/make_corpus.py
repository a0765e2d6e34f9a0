#!/usr/bin/env python3
"""Rebuilds fuzz/corpus/torch_save from the golden torch.save files (fixtures/golden/torch_save
and fixtures/golden/checkpoints): each seed is the archive's data.pkl followed by
"\\0RECORDS\\0" and lines: one "name size" line per storage record, and for a nested
checkpoint an "entry NAME" line, the entry the fuzzer looks up (the seeds of nested files
without it exercise the search of the usual entries). Run from the repository root."""
import json
import pathlib
import zipfile

out = pathlib.Path("fuzz/corpus/torch_save")
out.mkdir(parents=True, exist_ok=True)
expected = json.loads(pathlib.Path("fixtures/golden/checkpoints/expected.json").read_text())
for root in (pathlib.Path("fixtures/golden/torch_save"), pathlib.Path("fixtures/golden/checkpoints")):
    for pt in sorted(list(root.glob("*.pt")) + list(root.glob("*.ckpt"))):
        try:
            archive = zipfile.ZipFile(pt)
        except zipfile.BadZipFile:
            continue  # the deliberately truncated file, and the legacy format
        names = archive.namelist()
        prefix = names[0].split("/")[0] + "/"
        pickle = archive.read(prefix + "data.pkl")
        table = "".join(f"{n[len(prefix):]} {archive.getinfo(n).file_size}\n"
                        for n in names if n.startswith(prefix + "data/"))
        (out / (pt.stem + ".pkl")).write_bytes(pickle + b"\0RECORDS\0" + table.encode())
        entry = expected["files"].get(pt.name, {}).get("entry", "")
        if entry:
            (out / (pt.stem + "_entry.pkl")).write_bytes(
                pickle + b"\0RECORDS\0" + table.encode() + f"entry {entry}\n".encode())
