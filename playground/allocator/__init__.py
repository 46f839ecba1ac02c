"""A stand-in for the kube-scheduler's DRA allocator, for tests and the demo (not a scheduler).

`allocate` is pure (dicts in, claim status out); `allocate_and_reserve` does the same
through the API. See core.py for the search and devices.py / cel.py for the device model.
"""

from .api import allocate_and_reserve, allocate_on_node, allocate_together
from .core import AllocationError, allocate, allocate_claims

__all__ = ["AllocationError", "allocate", "allocate_claims", "allocate_and_reserve", "allocate_on_node",
           "allocate_together"]
