"""ResourceSlice controller: publishes a node's GPUs as DRA devices and keeps them true.

- slices.py: what to publish (pure functions: GPUs -> slice dicts, semantic comparison)
- reconciler.py: SliceController, the loop and watch that keep the server equal to it
- commands.py: the `controller` subcommand (its ControllerConfig) and delete_slices (for `cleanup`,
  kubeletplugin/uninstall.py)
"""

from .commands import ControllerConfig, delete_slices, run, run_controller
from .reconciler import Backoff, SliceController, SliceWatch

__all__ = ["Backoff", "ControllerConfig", "SliceController", "SliceWatch", "delete_slices", "run", "run_controller"]
