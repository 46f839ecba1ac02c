"""The `controller` subcommand of gpushare-dra, and the slice deletion `cleanup` uses."""

from __future__ import annotations

import argparse

from kubernetes import client

from ..discovery import make_backend
from ..flags import FlagError
from ..kube import api_client as make_api_client
from ..kube import json_body
from ..log import get_logger
from ..runloop import serve
from .reconciler import REQUEST_TIMEOUT, SliceController

log = get_logger("gpushare.controller")


def run(args: argparse.Namespace) -> int:
    """Publish this node's slices until SIGTERM or SIGINT; the slices stay afterwards."""
    if not args.node_name:
        raise FlagError("--node-name", "required (or set NODE_NAME): the slices' pool is named after the node")
    backend = make_backend(args.device_backend, args.mock_gpus, args.driver_root)
    controller = SliceController(make_api_client(args.kubeconfig), args.driver_name, args.node_name, backend,
                                 sharing_mode=args.sharing_mode, partitions=args.partitions,
                                 device_order=args.device_order)

    def start() -> SliceController:
        controller.start()
        log.info("slice controller running", node=args.node_name, driver=args.driver_name)
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
