"""The core figures on both raylite backends side by side (issue 7): the local runtime, and the
Ray backend on a local Ray started by ``init`` (the same programs, run by Ray's processes).

    python bench/backends.py [--seconds 1.0] [-v]

Each backend runs ``bench/core.py``'s measurements in a fresh child process; the last column is
local / Ray. Needs Ray (``pip install 'raylite[ray]'``) for the second column.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import core  # noqa: E402 - bench/core.py

BACKENDS = {"raylite": "local runtime", "raylite_on_ray": "Ray backend"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="duration of each throughput run")
    ap.add_argument("--timeout", type=float, default=600, help="limit per backend, in seconds")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the children's output")
    args = ap.parse_args()
    results = {}
    for module, label in BACKENDS.items():
        print(f"measuring raylite, {label} ...", file=sys.stderr, flush=True)
        results[label] = core.run_child(module, args)
    core.print_table(list(results), results)


if __name__ == "__main__":
    main()
