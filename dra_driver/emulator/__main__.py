"""Run the API emulator standalone: `gpushare-dra emulator` or `python -m dra_driver.emulator`.

Flags are defined once, in dra_driver/cli.py.
"""

import signal
import sys
import threading

from ..log import get_logger


def run(args) -> int:
    from .emulator import ApiEmulator

    emulator = ApiEmulator(consumable_capacity=args.consumable_capacity, device_taints=args.device_taints,
                           validate=args.validate, kube_version=args.kube_version,
                           host=args.host, port=args.port).start()
    if args.kubeconfig_out:
        emulator.write_kubeconfig(args.kubeconfig_out)
    get_logger("emulator").info("API emulator serving", url=emulator.url, kubeconfig=args.kubeconfig_out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    emulator.stop()
    return 0


if __name__ == "__main__":
    from ..cli import main

    sys.exit(main(["emulator", *sys.argv[1:]]))
