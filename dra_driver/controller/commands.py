"""The `controller` subcommand of gpushare-dra, and the slice deletion `cleanup` uses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kubernetes import client

from ..cli import DEFAULT_DRIVER_NAME
from ..devicemodel import BINPACK
from ..discovery import make_backend
from ..flags import FlagError, FromArgs
from ..kube import api_client as make_api_client
from ..kube import json_body
from ..log import get_logger
from ..runloop import serve
from .reconciler import REQUEST_TIMEOUT, SliceController

log = get_logger("gpushare.controller")


@dataclass(frozen=True)
class ControllerConfig(FromArgs):
    """Everything `gpushare-dra controller` is started with."""

    node_name: str  # required: from_args gives None when neither the flag nor NODE_NAME is set
    kubeconfig: str | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    device_backend: str = "nvml"
    mock_gpus: str | None = None
    driver_root: str | None = None
    sharing_mode: str = "auto"
    partitions: int = 8
    device_order: str = BINPACK

    def __post_init__(self) -> None:
        if not self.node_name:
            raise FlagError("--node-name", "required (or set NODE_NAME): the slices' pool is named after the node")


def run(args: argparse.Namespace) -> int:
    return run_controller(ControllerConfig.from_args(args))


def run_controller(config: ControllerConfig) -> int:
    """Publish this node's slices until SIGTERM or SIGINT; the slices stay afterwards."""
    backend = make_backend(config.device_backend, config.mock_gpus, config.driver_root)
    controller = SliceController(make_api_client(config.kubeconfig), config.driver_name, config.node_name, backend,
                                 sharing_mode=config.sharing_mode, partitions=config.partitions,
                                 device_order=config.device_order)

    def start() -> SliceController:
        controller.start()
        log.info("slice controller running", node=config.node_name, driver=config.driver_name)
        return controller

    return serve(start, log, "stopping; ResourceSlices are left in place (run `gpushare-dra cleanup` to remove them)")


def delete_slices(api_client: client.ApiClient, driver_name: str, node_name: str | None = None) -> int:
    """Delete the driver's slices of one node (or of every node when node_name is None); how many."""
    api = client.ResourceV1Api(api_client)
    selector = f"spec.driver={driver_name}" + (f",spec.nodeName={node_name}" if node_name else "")
    listed = json_body(api.list_resource_slice(field_selector=selector, _preload_content=False,
                                               _request_timeout=REQUEST_TIMEOUT))
    deleted = 0
    for item in listed.get("items") or []:
        try:
            api.delete_resource_slice(item["metadata"]["name"], _preload_content=False,
                                      _request_timeout=REQUEST_TIMEOUT)
            deleted += 1
        except client.ApiException as e:
            if e.status != 404:
                raise
    return deleted
