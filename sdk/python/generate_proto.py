"""Generates `switchyard.v1` (messages and their `.pyi` stubs) from the repository's `proto/`.

Run before using the package from a checkout (`python generate_proto.py`); `pip install` runs it
through `setup.py`. `--check DIR` generates into DIR instead, for comparing with the package.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto" / "proto"
# The files a worker and a producer speak, and quic.proto for a QUIC worker written from
# docs/quic-protocol.md (examples/quic_worker.py).
PROTOS = ("common.proto", "worker.proto", "gateway.proto", "quic.proto")


def generate(out: pathlib.Path, proto_root: pathlib.Path = PROTO_ROOT) -> None:
    """Runs protoc (bundled with grpcio-tools) over `PROTOS` into `out`."""
    from grpc_tools import protoc  # imported here: only building needs grpcio-tools

    files = [str(proto_root / "switchyard" / "v1" / name) for name in PROTOS]
    missing = [name for name in files if not pathlib.Path(name).is_file()]
    if missing:
        raise SystemExit(f"generate_proto: proto files not found: {missing}")
    args = ["protoc", f"-I{proto_root}", f"--python_out={out}", f"--pyi_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("generate_proto: protoc failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "src")
    parser.add_argument("--proto-root", type=pathlib.Path, default=PROTO_ROOT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    generate(args.out, args.proto_root)
    print(f"generated switchyard.v1 into {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
