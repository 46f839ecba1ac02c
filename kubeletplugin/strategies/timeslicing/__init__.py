"""sharingStrategy TimeSlicing (and None): the claim's containers preload the library, which holds
each process to the claim's memory budget and paces its kernels to its compute share; the node
agent hands out the GPU's time slots (kubeletplugin/agent/shares.py). All of it reads the claim's
files (kubeletplugin/claimfiles.py, hooklayout.py), which every claim gets, so the strategy has no
step of its own on the node (docs/strategies.md)."""

from __future__ import annotations

from kubeletplugin.strategies import Strategy


class TimeSlicing(Strategy):
    """Nothing to make, apply or give back beyond the claim's files and CDI spec."""
