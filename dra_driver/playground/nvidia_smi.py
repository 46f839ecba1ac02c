"""`nvidia-smi -L` on the playground's node: the GPUs the container's NVML shows (the simulated
driver's), in nvidia-smi's words. Only -L: the examples' containers list their GPUs, nothing more."""

from __future__ import annotations

import sys


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["-L"], ["--list-gpus"]):
        print(f"nvidia-smi (gpushare-dra playground): only -L is supported, not {' '.join(args) or 'no option'}",
              file=sys.stderr)
        return 2
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        print(f"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {e}", file=sys.stderr)
        return 9
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        print(f"GPU {i}: {_text(pynvml.nvmlDeviceGetName(handle))} (UUID: {_text(pynvml.nvmlDeviceGetUUID(handle))})")
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
