"""The `controller` and `cleanup` subcommands of gpushare-dra."""

from __future__ import annotations

import argparse

from kubernetes import client

from ..discovery import make_backend
from ..flags import FlagError
from ..kube import api_client as make_api_client
from ..kube import api_error, json_body
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


def run_cleanup(args: argparse.Namespace) -> int:
    if args.keep_slices and not args.node_state:
        raise FlagError("--keep-slices", "only with --node-state (otherwise there is nothing to do)")
    if not args.keep_slices and not args.all_nodes and not args.node_name:
        raise FlagError("--node-name", "required (or set NODE_NAME) to delete one node's slices; "
                                       "--all-nodes deletes every node's")
    if args.node_state:  # first: refused while claims are prepared, before anything is deleted
        from kubeletplugin.uninstall import NodeStateInUse, remove_node_state

        try:
            remove_node_state(args.state_dir, args.cdi_root, args.hook_dir, force=args.force)
        except NodeStateInUse as e:
            log.error("cleanup refused", error=str(e))
            return 1
    if args.keep_slices:
        return 0
    node = None if args.all_nodes else args.node_name
    try:
        deleted = delete_slices(make_api_client(args.kubeconfig), args.driver_name, node)
    except client.ApiException as e:
        log.error("cleanup failed", error=api_error(e))
        return 1
    log.info("deleted ResourceSlices", driver=args.driver_name, node=node or "<all nodes>", count=deleted)
    return 0
