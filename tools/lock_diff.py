"""What an environment has that the lock does not pin: one line per package whose version differs.

python tools/lock_diff.py requirements.lock     # run with the environment's own python (make test-latest)
"""

import importlib.metadata
import re
import sys
from pathlib import Path


def locked(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a pip-style lock (hash and comment lines skipped)."""
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", lock.read_text(), re.M)
    return {_norm(n): v for n, v in pins}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    pins = locked(Path(argv[0]))
    here = {_norm(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    changed = [(n, v, here[n]) for n, v in sorted(pins.items()) if n in here and here[n] != v]
    for name, old, new in changed:
        print(f"{name}: locked {old}, here {new}")
    added = sorted(set(here) - set(pins) - {"pip", "setuptools", "capgrpo"})
    for name in added:
        print(f"{name}: not in the lock, here {here[name]}")
    print(f"{len(changed)} of {len(pins)} locked packages at another version, {len(added)} not in the lock")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
