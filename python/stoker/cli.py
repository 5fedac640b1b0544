"""The ``stoker`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="stoker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run Stoker's main job on its built-in sample data")
    demo.add_argument("--root", help="where the sample data lives (default: ~/.cache/stoker)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(args.root)
    return 2


if __name__ == "__main__":
    sys.exit(main())
