"""Regenerate the Python protobuf/gRPC modules for every ``api/**/*.proto``.

Usage::

    python api/generate.py           # rewrite the generated files in place
    python api/generate.py --check   # exit 1 if any checked-in file is stale

Each proto is compiled as if it lived at ``crihook/api/<path below api/>`` so
the generated modules import each other absolutely (``from crihook.api.cri.v1
import api_pb2``), matching how setuptools installs this folder. A proto that
imports another one must therefore name it by that path, for example
``import "crihook/api/cri/v1/api.proto";``.

For every ``X.proto`` three files are written next to it: ``X_pb2.py``,
``X_pb2.pyi`` and ``X_pb2_grpc.py``; those suffixes are reserved for generated
code, so such a file under api/ without a matching ``.proto`` is deleted (or,
with ``--check``, reported as stale). The output depends only on the proto
sources and on the grpcio-tools version (its bundled protoc stamps a version
into the files), so ``--check`` fails after a generator upgrade too: rerun the
generator and commit the result.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

API_DIR = Path(__file__).resolve().parent
PACKAGE_PREFIX = Path("crihook") / "api"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def find_protos() -> list[Path]:
    """All proto sources under api/, relative to it, in a stable order."""
    return sorted(p.relative_to(API_DIR) for p in API_DIR.rglob("*.proto"))


def generated_names(proto: Path) -> list[Path]:
    stem = proto.with_suffix("")
    return [stem.with_name(stem.name + suffix) for suffix in GENERATED_SUFFIXES]


def find_generated() -> list[Path]:
    """Generated-looking files currently under api/, relative to it."""
    found: set[Path] = set()
    for suffix in GENERATED_SUFFIXES:
        found.update(p.relative_to(API_DIR) for p in API_DIR.rglob("*" + suffix))
    return sorted(found)


def well_known_include() -> Path:
    """grpc_tools' bundled google/protobuf/*.proto directory."""
    import grpc_tools  # type: ignore[import-untyped, unused-ignore]

    return Path(grpc_tools.__file__).resolve().parent / "_proto"


def generate_into(out_root: Path, protos: list[Path]) -> None:
    """Compile ``protos`` and leave the outputs in ``out_root``, laid out like api/."""
    with tempfile.TemporaryDirectory(prefix="crihook-protoc-") as tmp:
        tmp_path = Path(tmp)
        src = tmp_path / "src"
        out = tmp_path / "out"
        out.mkdir()
        for proto in protos:
            target = src / PACKAGE_PREFIX / proto
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(API_DIR / proto, target)
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{src}",
            f"-I{well_known_include()}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *(str(PACKAGE_PREFIX / proto) for proto in protos),
        ]
        result = subprocess.run(cmd, cwd=src, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            raise SystemExit(f"protoc failed with exit code {result.returncode}")
        for proto in protos:
            for name in generated_names(proto):
                produced = out / PACKAGE_PREFIX / name
                if not produced.is_file():
                    raise SystemExit(f"protoc did not produce {PACKAGE_PREFIX / name}")
                dest = out_root / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(produced, dest)


def write(protos: list[Path]) -> int:
    with tempfile.TemporaryDirectory(prefix="crihook-gen-") as tmp:
        fresh = Path(tmp)
        generate_into(fresh, protos)
        expected = {name for proto in protos for name in generated_names(proto)}
        for name in sorted(expected):
            dest = API_DIR / name
            if not dest.is_file() or not filecmp.cmp(fresh / name, dest, shallow=False):
                shutil.copyfile(fresh / name, dest)
                print(f"wrote api/{name}")
        for orphan in sorted(set(find_generated()) - expected):
            (API_DIR / orphan).unlink()
            print(f"removed api/{orphan} (no matching .proto)")
    return 0


def check(protos: list[Path]) -> int:
    stale: list[str] = []
    with tempfile.TemporaryDirectory(prefix="crihook-gen-") as tmp:
        fresh = Path(tmp)
        generate_into(fresh, protos)
        expected = {name for proto in protos for name in generated_names(proto)}
        for name in sorted(expected):
            dest = API_DIR / name
            if not dest.is_file():
                stale.append(f"api/{name} (missing)")
            elif not filecmp.cmp(fresh / name, dest, shallow=False):
                stale.append(f"api/{name} (differs)")
        for orphan in sorted(set(find_generated()) - expected):
            stale.append(f"api/{orphan} (no matching .proto)")
    if stale:
        print("generated protobuf code is stale; run `python api/generate.py`:", file=sys.stderr)
        for entry in stale:
            print(f"  {entry}", file=sys.stderr)
        return 1
    print(f"generated protobuf code is up to date ({len(protos)} proto file(s))")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and fail if the checked-in files differ",
    )
    args = parser.parse_args(argv)
    protos = find_protos()
    if not protos:
        print("no .proto files under api/", file=sys.stderr)
        return 1
    return check(protos) if args.check else write(protos)


if __name__ == "__main__":
    raise SystemExit(main())
