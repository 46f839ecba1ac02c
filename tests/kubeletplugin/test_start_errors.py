"""A port taken between the flag check and the bind: one flag error, and no socket left behind."""

import os
import socket

import pytest

from dra_driver.cli import build_parser
from kubeletplugin.main import Plugin, PluginConfigError


def test_metrics_port_taken_after_the_check_leaves_no_socket(api, dirs, hook_dir):
    args = build_parser().parse_args(["kubelet-plugin", *dirs.flags(hook_dir)])
    plugin = Plugin(args, api=api)  # the check passes: metrics disabled here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        plugin.args.metrics_addr = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(PluginConfigError, match=f"--metrics-addr: cannot listen on {plugin.args.metrics_addr}"):
            plugin.start()
    assert not os.path.exists(dirs.dra_socket) and not os.path.exists(dirs.reg_socket)
