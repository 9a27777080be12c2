"""The shipped embedded files, tracked compressed (`.xz`) and unpacked beside their archive.

The tracked tree travels to the GPU machine with every call (64 MiB a call, the tree included), so it is kept
at 20 MB or less. The shipped base's fp32 weights (12.5 MB) and the embedded task snapshot (0.43 MB) are tracked as
`.xz` (10.6 MB and 37 KB) and unpacked into the plain files every recipe, plan and test names, which git ignores.
`make setup`, `make train`, the suite (tests/conftest.py) and the launcher unpack them; each file's bytes
are pinned here by sha256. A plain file that is there with other bytes is refused by name, never replaced.

    python -m embedded.shipped                     # unpack (nothing to do where the plain files are the pinned bytes)
    python -m embedded.shipped --pack FILE         # a new shipped file -> FILE.xz (then pin its sha256 below)
    xz -dk embedded/base/model.safetensors.xz      # the same bytes by hand
"""

import argparse
import hashlib
import lzma
import sys
from pathlib import Path

from data.atomic import sha256_file, write_atomic

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "embedded/base/model.safetensors": "65bfcdb7f666a19045354aa0b486b44d4267d1c45077106fa6b6a4811462a1cf",
    "embedded/synthetic.tasks.json": "d645f237128e19523dfe038882e1d984f6209e09578b2f334fda25c6a86797ab",
}
# fp32 weights are 4-byte words: literals without context bits, positions modulo 4 (lc=0, lp=2, pb=2) make the
# weights 10,629,920 B against 11,544,700 B at plain -9e (the snapshot: 36,764 B against 36,516)
FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "lc": 0, "lp": 2, "pb": 2}]


class ShippedError(ValueError):
    """A shipped file we cannot unpack, or a plain file that is not the shipped bytes; the message names it."""


def unpack(root: Path = ROOT) -> list[Path]:
    """Every shipped file from its `.xz`, where the plain file is not there yet; returns those written."""
    written = []
    for name, pinned in SHIPPED.items():
        plain, packed = root / name, root / f"{name}.xz"
        if plain.is_file():
            if sha256_file(plain) != pinned:
                raise ShippedError(
                    f"{plain}: not the shipped bytes of {packed.name} (sha256 pinned {pinned[:12]}…); move it away to unpack"
                )
            continue
        try:
            data = lzma.decompress(packed.read_bytes())
        except (OSError, lzma.LZMAError) as e:
            raise ShippedError(f"{packed}: not a readable .xz ({e})") from None
        if (sha := hashlib.sha256(data).hexdigest()) != pinned:
            raise ShippedError(
                f"{packed}: unpacks to sha256 {sha[:12]}…, embedded/shipped.py pins {pinned[:12]}…"
            )
        written.append(write_atomic(plain, data))  # two processes unpacking at once write the same bytes
    return written


def pack(plain: Path) -> Path:
    """`plain` into `plain.xz` (deterministic for one liblzma), read back before it counts; an existing .xz is refused."""
    packed = plain.with_name(plain.name + ".xz")
    if packed.exists():
        raise ShippedError(f"{packed}: exists; remove it to pack {plain.name} anew")
    data = plain.read_bytes()
    blob = lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=FILTERS)
    if lzma.decompress(blob) != data:
        raise ShippedError(f"{plain}: its .xz reads back with other bytes; nothing written")
    return write_atomic(packed, blob)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedded.shipped", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pack", type=Path, metavar="FILE", help="write FILE.xz (a new shipped file) and print its sha256"
    )
    args = parser.parse_args(argv)
    try:
        if args.pack:
            packed = pack(args.pack)
            print(
                f"{packed}: {packed.stat().st_size} bytes; sha256 of {args.pack.name}: {sha256_file(args.pack)}"
            )
        else:
            for path in unpack():
                print(f"{path.relative_to(ROOT)}: unpacked")
    except (ShippedError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
