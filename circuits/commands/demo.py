"""``af1 demo``: the README's main job."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")


def run(args: argparse.Namespace) -> int:
    print("af1 demo: nothing to run yet")
    return 0
