"""Regenerate the Python stubs in libs/contracts from proto/clairvoyant/v1 (run by `make proto`).

Uses grpcio-tools' bundled protoc, so it works offline.  protoc names the generated modules after
the proto package (``clairvoyant.v1``); we place them under ``clairvoyant.contracts.v1`` and
rewrite the cross-file imports to match.  ``tests/contracts/test_contract_drift.py`` calls
``generate(into=tmpdir)`` and fails when the committed stubs differ.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "libs" / "contracts" / "src" / "clairvoyant" / "contracts" / "v1"
_IMPORT = re.compile(r"^from clairvoyant\.v1 import ", re.MULTILINE)


def generate(into: Path = OUT) -> list[Path]:
    """Generate stubs for every proto into ``into``; returns the files written."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "clairvoyant" / "v1").glob("*.proto"))
    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        into.mkdir(parents=True, exist_ok=True)
        for old in into.glob("*_pb2*.py*"):
            old.unlink()
        written = []
        for src in sorted((Path(tmp) / "clairvoyant" / "v1").iterdir()):
            text = _IMPORT.sub("from clairvoyant.contracts.v1 import ", src.read_text())
            dst = into / src.name
            dst.write_text(text)
            written.append(dst)
    init = into / "__init__.py"
    init.write_text('"""Generated protobuf and gRPC stubs for clairvoyant.v1 (do not edit; `make proto`)."""\n')
    return [*written, init]


if __name__ == "__main__":
    files = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
    print(f"generated {len(files)} files into {files[0].parent}")
    shutil.rmtree(ROOT / "libs" / "contracts" / "src" / "clairvoyant" / "v1", ignore_errors=True)
