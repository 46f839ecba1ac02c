"""`gpushare-dra demo`: the story of one shared claim (demo.py) or, with --strategies, one claim
of each sharing strategy side by side on one GPU (demo_strategies.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from kubeletplugin.claimfiles import unmount_all_regions

from .demo import Demo
from .demo_strategies import StrategiesDemo


def run(args: argparse.Namespace) -> int:
    from dra_driver.discovery import MockBackend

    MockBackend(args.mock_gpus)  # a bad --mock-gpus is the CLI's one-line error, before anything starts
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpushare-demo-")
    os.makedirs(workdir, exist_ok=True)
    print(f"gpushare-dra demo: simulated GPUs {args.mock_gpus}; files under {workdir}")
    started = time.monotonic()
    try:
        if args.strategies:
            code = StrategiesDemo(args.mock_gpus, workdir, args.runtime).run()
        else:
            code = Demo(args.mock_gpus, workdir, args.runtime).run()
    finally:
        if not args.workdir:
            unmount_all_regions(os.path.join(workdir, "state"))  # claims its node left prepared
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"({time.monotonic() - started:.1f}s)")
    return code
