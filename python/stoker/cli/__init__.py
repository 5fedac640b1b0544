"""The ``stoker`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="stoker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run Stoker's main job on its built-in sample data")
    demo.add_argument("--root", help="where the sample data lives (default: the sample data root)")
    sub.add_parser("make-sample", add_help=False,
                   help="build the built-in ImageNet-like sample data (see make-sample --help)")
    sub.add_parser("stats", add_help=False,
                   help="per-channel mean and std of an image dataset, for Normalize; "
                        "--classes: class counts and how batches mix them (see stats --help)")
    sub.add_parser("tune", add_help=False,
                   help="find num_workers, prefetch_factor, pin_memory (and batch_size) for "
                        "Stoker's loader or a torch DataLoader (see tune --help)")
    sub.add_parser("diagnose", add_help=False,
                   help="is the loader or the model the bottleneck? (see diagnose --help)")
    sub.add_parser("index", add_help=False,
                   help="write the sidecar index of tar shards (or token files split at --eos), "
                        "local or remote, so remote datasets start without downloading them")
    sub.add_parser("info", add_help=False,
                   help="this Stoker's version, build and the optional parts it found, for a "
                        "bug report (see info --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["info"]:
        from ..info import main as info_main
        return info_main(argv[1:])
    if argv[:1] == ["tune"]:
        from ..tuning.tune import main as tune_main
        return tune_main(argv[1:])
    if argv[:1] == ["diagnose"]:
        from ..tuning.diagnose import main as diagnose_main
        return diagnose_main(argv[1:])
    if argv[:1] == ["make-sample"]:
        from ..sample_data import main as make_sample_main
        return make_sample_main(argv[1:])
    if argv[:1] == ["index"]:
        from .index import main as index_main
        return index_main(argv[1:])
    if argv[:1] == ["stats"]:
        from ..tuning.stats import main as stats_main
        return stats_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(args.root)
    return 2


if __name__ == "__main__":
    sys.exit(main())
