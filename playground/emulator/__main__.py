"""Run the API emulator standalone: `gpushare-dra emulator` or `python -m playground.emulator`.

Flags are defined once, in dra_driver/cli.py.
"""

import sys

from dra_driver.flags import FlagError, check_port_free
from dra_driver.log import get_logger
from dra_driver.runloop import serve


def kube_version(text):
    """'1.35', 'v1.35' or '1.35.2' -> '1.35' when kubernetes-validate ships schemas for every
    resource.k8s.io type the emulator serves (older versions would fail every write), else FlagError."""
    from .resources import RESOURCE_TYPES
    from .validation import kube_versions_with_schemas

    known = kube_versions_with_schemas([rt for rt in RESOURCE_TYPES if rt.group == "resource.k8s.io"])
    wanted = ".".join(text.strip().lstrip("v").split(".")[:2])
    if wanted not in known:
        raise FlagError("--kube-version", f"no resource.k8s.io schemas for {text!r} (accepted: {', '.join(known)})")
    return wanted


def check_flags(args) -> str | None:
    """The emulator's flags checked before anything starts (a bad one is the CLI's one-line
    error); the --kube-version to serve."""
    version = kube_version(args.kube_version) if args.kube_version else None
    check_port_free("--port", args.host, args.port)
    return version


def start_emulator(args, version):
    """The emulator as the flags (shared by `emulator` and `playground`) say; serving."""
    from .emulator import ApiEmulator

    return ApiEmulator(consumable_capacity=args.consumable_capacity, device_taints=args.device_taints,
                       validate=args.validate, kube_version=version, host=args.host, port=args.port).start()


def run(args) -> int:
    version = check_flags(args)
    log = get_logger("emulator")

    def start():
        emulator = start_emulator(args, version)
        if args.kubeconfig_out:  # written last: its presence says the server answers
            emulator.write_kubeconfig(args.kubeconfig_out)
        log.info("API emulator serving", url=emulator.url, kubeconfig=args.kubeconfig_out)
        return emulator

    return serve(start, log, "API emulator stopping")


if __name__ == "__main__":
    from dra_driver.cli import main

    sys.exit(main(["emulator", *sys.argv[1:]]))
