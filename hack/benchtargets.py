"""The targets the benchmarks in hack/ print, checked in one way: a bench records each with
`Targets.met` and ends with `return targets.status()`, which prints a last line naming the missed
ones (`missed: launch path +46 ns, target < 20 ns`) and returns 1, else 0 and no line. `make
bench` runs every bench and fails if any did. (Imported from the script's own folder, which
Python puts on sys.path.)"""

from __future__ import annotations


class Targets:
    def __init__(self) -> None:
        self.missed: list[str] = []

    def met(self, ok: bool, what: str) -> bool:
        """ok: the target is met; what: the measure, its value and its target, for the last line."""
        if not ok:
            self.missed.append(what)
        return ok

    def status(self) -> int:
        if not self.missed:
            return 0
        print("missed: " + "; ".join(self.missed), flush=True)
        return 1
