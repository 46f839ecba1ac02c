"""Flag errors at start: a port taken between the flag check and the bind (one flag error, and no
socket left behind); a GPU list given to Plugin directly (the flag named once)."""

import os
import socket
from dataclasses import replace

import pytest

from kubeletplugin.main import Plugin, PluginConfigError
from tests.support.plugin import plugin_config


def test_metrics_port_taken_after_the_check_leaves_no_socket(api, dirs, hook_dir):
    plugin = Plugin(plugin_config(dirs, hook_dir), api=api)  # the check passes: metrics disabled here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        plugin.config = replace(plugin.config, metrics_addr=f"127.0.0.1:{s.getsockname()[1]}")
        with pytest.raises(PluginConfigError, match=f"--metrics-addr: cannot listen on {plugin.config.metrics_addr}"):
            plugin.start()
    assert not os.path.exists(dirs.dra_socket) and not os.path.exists(dirs.reg_socket)


@pytest.mark.parametrize("field, flag", [("mig_gpus", "--mig-gpus"), ("mps_gpus", "--mps-gpus")])
def test_a_bad_gpu_list_names_its_flag_once(api, dirs, hook_dir, field, flag):
    with pytest.raises(PluginConfigError) as e:
        Plugin(replace(plugin_config(dirs, hook_dir), **{field: "x"}), api=api)
    assert str(e.value) == f"{flag}: 'x': expected none, all, or GPU indexes like 0,2"
