"""The command line: the contract's flags and defaults, and clear errors.

Every command-line error is one human line on stderr, `gpushare-dra CMD: error: --flag: ...`,
exit status 2, with nothing started or left behind; the subprocess tests assert the exact line
(stderr is a pipe here, not a terminal, so these lines must not be JSON log records).
"""

import argparse
import contextlib
import http.server
import io
import re
import socket
import subprocess
import sys
import threading

import grpc
import pytest
import yaml

from dra_driver.cli import build_parser, main

CLI = [sys.executable, "-m", "dra_driver.cli"]
MOCK_ACCEPTED = ("accepted: COUNTxMEMORY groups such as 2x80Gi or 1x80Gi,2x40Gi (1x80Gi:mig: in MIG mode), "
                 "or a YAML file")


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_kubelet_plugin_defaults_match_the_contract(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "node-a")
    args = parse("kubelet-plugin")
    assert args.node_name == "node-a"
    assert args.kubeconfig is None
    assert args.driver_name == "gpushare.dev"
    assert args.plugin_dir is None  # resolved to /var/lib/kubelet/plugins/<driver-name>
    assert args.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert args.cdi_root == "/var/run/cdi"
    assert args.state_dir == "/var/lib/gpushare"
    assert args.device_backend == "nvml"
    assert args.sharing_mode == "auto"
    assert args.partitions == 8
    assert args.metrics_addr == ":9400"
    assert args.driver_root is None  # NVML from the dynamic loader's path


@pytest.mark.parametrize("command", ["kubelet-plugin", "controller", "cleanup", "discover", "demo", "hook-path",
                                     "install-hook", "emulator", "playground"])
def test_every_subcommand_has_help(command):
    out = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"usage: gpushare-dra {command}")


def test_plugin_help_teaches_every_contract_flag():
    out = subprocess.run([*CLI, "kubelet-plugin", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--node-name", "--kubeconfig", "--driver-name", "--plugin-dir", "--registry-dir", "--cdi-root",
                 "--state-dir", "--device-backend", "--mock-gpus", "--sharing-mode", "--partitions", "--hook-dir",
                 "--metrics-addr", "--log-level", "--driver-root"):
        assert flag in out
    assert "/var/lib/kubelet/plugins/<driver-name>" in out
    assert "DRAConsumableCapacity" in out


@pytest.mark.parametrize("argv, message", [
    (["kubelet-plugin", "--partitions", "0"], "0 is out of range 1..128"),
    (["kubelet-plugin", "--partitions", "eight"], "'eight' is not an integer"),
    (["kubelet-plugin", "--sharing-mode", "slices"], "invalid choice: 'slices'"),
    (["discover", "--device-backend", "mock", "--mock-gpus", "2xlots"], "--mock-gpus memory: not a valid quantity"),
])
def test_bad_flags_are_named(argv, message):
    res = subprocess.run([*CLI, *argv], capture_output=True, text=True)
    assert res.returncode == 2
    assert message in res.stderr


def test_discover_mock_prints_gpus():
    res = subprocess.run([*CLI, "discover", "--device-backend", "mock", "--mock-gpus", "2x24Gi"],
                         capture_output=True, text=True, check=True)
    assert res.stdout.count("uuid: GPU-5ea1c0de-0000-4000-8000-") == 2
    assert "memory: 24Gi" in res.stdout


def test_discover_says_why_a_gpu_named_for_mig_offers_no_mig_devices(capsys):
    # MIG mode off (read, never switched): published as without --mig-gpus, and the plugin's reason printed
    import yaml

    def discover(*flags):
        assert main(["discover", "--device-backend", "mock", "--mock-gpus", "2x80Gi", "--sharing-mode", "capacity",
                     *flags]) == 0
        return yaml.safe_load(capsys.readouterr().out)

    plain, named = discover(), discover("--mig-gpus", "1")
    assert named["devices"] == plain["devices"] and [d["name"] for d in named["devices"]["capacity"]] == ["gpu-0",
                                                                                                       "gpu-1"]
    assert "mig" not in plain
    [note] = named["mig"]["notes"]
    assert note.startswith("GPU 1 (GPU-") and "is named by --mig-gpus but its MIG mode is disabled: no MIG devices, " \
        "offered as before; the driver never switches it (nvidia-smi -i 1 -mig 1" in note


def refused(argv, env=None):
    """Run the CLI; assert exit status 2 and exactly one line on stderr, and return that line.
    With env: as a program of its own (the entry point, the environment it reads at start-up);
    without: main() in this process, which is what the program runs (a second apiece saved)."""
    if env is not None:
        res = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, env=env)
        code, out, err = res.returncode, res.stdout, res.stderr
    else:
        out_buf, err_buf = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_buf), contextlib.redirect_stderr(err_buf):
            try:
                code = main(list(argv))
            except SystemExit as e:  # argparse's own refusals
                code = e.code
        out, err = out_buf.getvalue(), err_buf.getvalue()
    assert code == 2, (code, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert out == ""
    return err.rstrip("\n")


def test_unknown_arguments_are_named_with_their_subcommand():
    assert refused(["top", "--once", "extra", "--x=1"]) == (
        "gpushare-dra top: error: unrecognized arguments: extra --x=1 (see gpushare-dra top --help)")


ADDR_ACCEPTED = "(accepted: HOST:PORT such as :9400, 127.0.0.1:9400 or [::1]:9400; empty disables)"
URL_ACCEPTED = "(accepted: HOST:PORT such as 127.0.0.1:9400, or a URL such as http://HOST:PORT/metrics)"
PORT_ACCEPTED = "(accepted: 0..65535)"
KUBECONFIG_ACCEPTED = "(accepted: a kubeconfig file path; leave it unset inside a pod)"
ANY_FREE = "(accepted: a free port, or 0 for any free one)"
XIDS_ACCEPTED = ("(accepted: XID numbers 0..4294967295 separated by commas such as 63,92, or all alone; "
                 "empty adds none)")
BELOW_1GI = "is below 1Gi (accepted: 1Gi or more, with its unit: 80Gi)"


def kube_versions():
    """What the installed kubernetes-validate has resource.k8s.io/v1 schemas for (1.34 on)."""
    from playground.emulator.resources import RESOURCE_TYPES
    from playground.emulator.validation import kube_versions_with_schemas

    known = kube_versions_with_schemas([rt for rt in RESOURCE_TYPES if rt.group == "resource.k8s.io"])
    assert known[0] == "1.34", known  # resource.k8s.io/v1 is new in 1.34
    return ", ".join(known)


@pytest.mark.parametrize("argv, line", [
    (["kubelet-plugin", "--metrics-addr", "foo"],
     f"gpushare-dra kubelet-plugin: error: --metrics-addr: 'foo' is not HOST:PORT {ADDR_ACCEPTED}"),
    (["kubelet-plugin", "--metrics-addr", "127.0.0.1:99999"],
     f"gpushare-dra kubelet-plugin: error: --metrics-addr: '127.0.0.1:99999' is not HOST:PORT {ADDR_ACCEPTED}"),
    (["kubelet-plugin", "--healthcheck-port", "-1"],
     f"gpushare-dra kubelet-plugin: error: --healthcheck-port: '-1' is not a TCP port {PORT_ACCEPTED}"),
    (["kubelet-plugin", "--healthcheck-port", "70000"],
     f"gpushare-dra kubelet-plugin: error: --healthcheck-port: '70000' is not a TCP port {PORT_ACCEPTED}"),
    (["emulator", "--port", "70000"],
     f"gpushare-dra emulator: error: --port: '70000' is not a TCP port {PORT_ACCEPTED}"),
    (["kubelet-plugin", "--kubeconfig", "/nonexistent/kubeconfig"],
     "gpushare-dra kubelet-plugin: error: --kubeconfig: '/nonexistent/kubeconfig' does not exist or is not a file "
     + KUBECONFIG_ACCEPTED),
    (["cleanup", "--kubeconfig", "/dev/null/x"],
     f"gpushare-dra cleanup: error: --kubeconfig: '/dev/null/x' does not exist or is not a file {KUBECONFIG_ACCEPTED}"),
    (["kubelet-plugin", "--partitions", "0"],
     "gpushare-dra kubelet-plugin: error: --partitions: 0 is out of range 1..128"),
    (["top", "--once", "--url", "foo"], f"gpushare-dra top: error: --url: 'foo' is not a metrics URL {URL_ACCEPTED}"),
    (["top", "--once", "--url", "ftp://127.0.0.1:9400/metrics"],
     f"gpushare-dra top: error: --url: 'ftp://127.0.0.1:9400/metrics' is not a metrics URL {URL_ACCEPTED}"),
    (["emulator", "--kube-version", "1.99"],
     "gpushare-dra emulator: error: --kube-version: no resource.k8s.io schemas for '1.99' (accepted: {versions})"),
    (["emulator", "--kube-version", "1.20"],
     "gpushare-dra emulator: error: --kube-version: no resource.k8s.io schemas for '1.20' (accepted: {versions})"),
    (["discover", "--device-backend", "mock", "--mock-gpus", "2x80"],
     f"gpushare-dra discover: error: --mock-gpus memory: '80' in '2x80' {BELOW_1GI}"),
    (["discover", "--device-backend", "mock", "--mock-gpus", "0x80Gi"],
     f"gpushare-dra discover: error: --mock-gpus: count in '0x80Gi' is below 1 ({MOCK_ACCEPTED})"),
    (["demo", "--mock-gpus", "2x80"], f"gpushare-dra demo: error: --mock-gpus memory: '80' in '2x80' {BELOW_1GI}"),
    (["playground", "--mock-gpus", "2x80"],
     f"gpushare-dra playground: error: --mock-gpus memory: '80' in '2x80' {BELOW_1GI}"),
    (["playground", "--kube-version", "1.99"],
     "gpushare-dra playground: error: --kube-version: no resource.k8s.io schemas for '1.99' (accepted: {versions})"),
    (["discover", "--mock-gpus", "2x80Gi"],
     "gpushare-dra discover: error: --mock-gpus: only with --device-backend mock (this is --device-backend nvml); "
     "remove it, or add --device-backend mock"),
    (["kubelet-plugin", "--health-ignore-xids", "abc"],
     f"gpushare-dra kubelet-plugin: error: --health-ignore-xids: 'abc' is not an XID {XIDS_ACCEPTED}"),
    (["kubelet-plugin", "--health-ignore-xids", "-3"],
     f"gpushare-dra kubelet-plugin: error: --health-ignore-xids: '-3' is not an XID {XIDS_ACCEPTED}"),
    (["kubelet-plugin", "--health-ignore-xids", "1,,2"],
     f"gpushare-dra kubelet-plugin: error: --health-ignore-xids: '' in '1,,2' is not an XID {XIDS_ACCEPTED}"),
    (["kubelet-plugin", "--health-ignore-xids", "all,13"],
     f"gpushare-dra kubelet-plugin: error: --health-ignore-xids: 'all' in 'all,13' is not an XID {XIDS_ACCEPTED}"),
    (["kubelet-plugin", "--mig-gpus", "x"],  # the flag named once, not again by the parser's own message
     "gpushare-dra kubelet-plugin: error: --mig-gpus: 'x': expected none, all, or GPU indexes like 0,2"),
    (["discover", "--mig-gpus", "0,x"],
     "gpushare-dra discover: error: --mig-gpus: '0,x': expected none, all, or GPU indexes like 0,2"),
    (["kubelet-plugin", "--mps-gpus", "0,-1"],
     "gpushare-dra kubelet-plugin: error: --mps-gpus: '0,-1': GPU indexes are 0 or more"),
    (["kubelet-plugin", "--health-ignore-xids=79,4294967296"],
     "gpushare-dra kubelet-plugin: error: --health-ignore-xids: '4294967296' in '79,4294967296' is not an XID "
     + XIDS_ACCEPTED),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv, line):
    assert refused(argv) == (line.format(versions=kube_versions()) if "{versions}" in line else line)


@pytest.mark.parametrize("given, ignored", [
    ("", frozenset()),
    ("79", frozenset({79})),
    (" 79, 94,79 ", frozenset({79, 94})),
    ("0,4294967295", frozenset({0, 2**32 - 1})),
    ("all", "all"),
])
def test_health_ignore_xids_values(given, ignored):
    assert parse("kubelet-plugin", "--health-ignore-xids", given).health_ignore_xids == ignored


def test_health_ignore_xids_default_and_env(monkeypatch):
    monkeypatch.delenv("GPUSHARE_HEALTH_IGNORE_XIDS", raising=False)
    assert parse("kubelet-plugin").health_ignore_xids == frozenset()
    monkeypatch.setenv("GPUSHARE_HEALTH_IGNORE_XIDS", "79,94")
    assert parse("kubelet-plugin").health_ignore_xids == frozenset({79, 94})
    assert parse("kubelet-plugin", "--health-ignore-xids", "all").health_ignore_xids == "all"  # the flag wins


def test_a_bad_health_ignore_xids_env_is_one_line_naming_the_flag():
    import os

    env = dict(os.environ, GPUSHARE_HEALTH_IGNORE_XIDS="79;94")
    assert refused(["kubelet-plugin"], env=env) == (
        f"gpushare-dra kubelet-plugin: error: --health-ignore-xids: '79;94' is not an XID {XIDS_ACCEPTED}")


def test_missing_node_name_is_one_line(monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    import os

    assert refused(["controller"], env=dict(os.environ)) == (
        "gpushare-dra controller: error: --node-name: required (or set NODE_NAME): the slices' pool is named "
        "after the node")


def test_argparse_errors_are_one_line_too():
    line = refused(["kubelet-plugin", "--sharing-mode", "slices"])
    assert line.startswith("gpushare-dra kubelet-plugin: error: --sharing-mode: invalid choice: 'slices'"), line
    assert refused(["kubelet-plugin", "--no-such-flag"]) == (
        "gpushare-dra kubelet-plugin: error: unrecognized arguments: --no-such-flag "
        "(see gpushare-dra kubelet-plugin --help)")


@pytest.fixture
def taken_port():
    """A port another process's server listens on, with SO_REUSEPORT as gRPC servers set it."""
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("[::]:0")
    server.start()
    yield port
    server.stop(0)


def _plugin_argv(tmp_path, *extra):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    return ["kubelet-plugin", "--node-name", "node-a", "--kubeconfig", str(kubeconfig), "--device-backend", "mock",
            "--plugin-dir", str(tmp_path / "plugin"), "--registry-dir", str(tmp_path / "registry"),
            "--state-dir", str(tmp_path / "state"), "--cdi-root", str(tmp_path / "cdi"), *extra]


def test_a_taken_metrics_port_is_refused_before_anything_starts(tmp_path, taken_port):
    line = refused(_plugin_argv(tmp_path, "--metrics-addr", f"127.0.0.1:{taken_port}", "--healthcheck-port", "0"))
    assert line == (f"gpushare-dra kubelet-plugin: error: --metrics-addr: 127.0.0.1:{taken_port} is already in use "
                    f"by another process {ANY_FREE}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubeconfig"]  # no socket, folder or state


def test_a_healthcheck_port_another_plugin_holds_is_refused(tmp_path, taken_port):
    line = refused(_plugin_argv(tmp_path, "--metrics-addr", "127.0.0.1:0", "--healthcheck-port", str(taken_port)))
    assert line == (f"gpushare-dra kubelet-plugin: error: --healthcheck-port: port {taken_port} is already in use "
                    "by another process (accepted: a free port, or 0 to disable)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubeconfig"]


def test_liveness_server_does_not_share_a_port(taken_port):
    """Past the check (a port taken in between), gRPC's SO_REUSEPORT must not let two plugins listen."""
    import types

    from grpc_health.v1 import health

    from kubeletplugin.main import Plugin, PluginConfigError

    with pytest.raises(PluginConfigError, match=f"--healthcheck-port: cannot listen on port {taken_port}"):
        Plugin._serve_liveness(types.SimpleNamespace(health=health.HealthServicer()), taken_port)


def test_a_taken_emulator_port_is_refused(taken_port):
    assert refused(["emulator", "--port", str(taken_port)]) == (
        f"gpushare-dra emulator: error: --port: 127.0.0.1:{taken_port} is already in use by another process {ANY_FREE}")


def test_demo_without_the_demo_extra_prints_the_install_hint():
    hide = "import sys; sys.modules['jsonschema'] = None; from dra_driver.cli import main; sys.exit(main(['demo']))"
    res = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("gpushare-dra demo: error: needs the optional 'demo' dependencies (jsonschema is "
                          "missing); install them with: pip install 'gpushare-dra[demo]'\n")


def test_version_names_the_package_and_platform():
    out = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and re.match(r"gpushare-dra \S+ \(Python 3\.\d+", out.stdout), out


def test_help_shows_each_default_once():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        formatter = sub.formatter_class(prog=sub.prog)
        for action in sub._actions:
            text = formatter._get_help_string(action) or ""
            assert len(re.findall(r"\(default[: ]", text)) <= 1, (name, action.dest, text)
            assert "%(default)s" not in text or action.default is not None, (name, action.dest, text)
    out = subprocess.run([*CLI, "emulator", "--help"], capture_output=True, text=True, check=True).stdout
    assert "(default: None)" not in out


@pytest.mark.parametrize("given, url", [
    ("127.0.0.1:9400", "http://127.0.0.1:9400/metrics"),
    (":9400", "http://127.0.0.1:9400/metrics"),
    ("[::1]:9400", "http://[::1]:9400/metrics"),
    ("http://node-a:9400", "http://node-a:9400/metrics"),
    ("https://node-a/custom", "https://node-a/custom"),
])
def test_top_url_forms(given, url):
    assert parse("top", "--url", given).url == url


METRICS_TEXT = b"""# TYPE gpushare_prepared_claims gauge
gpushare_prepared_claims 1
# TYPE gpushare_claim_memory_limit_bytes gauge
gpushare_claim_memory_limit_bytes{namespace="ns",claim="c",gpu="GPU-x"} 4294967296
"""


def test_top_reads_host_port(tmp_path):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(METRICS_TEXT)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = subprocess.run([*CLI, "top", "--once", "--url", f"127.0.0.1:{server.server_port}"],
                             capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert res.returncode == 0, res.stderr
    assert "prepared claims: 1" in res.stdout and "ns/c" in res.stdout and "4Gi" in res.stdout


def test_top_unreachable_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    res = subprocess.run([*CLI, "top", "--once", "--url", f"127.0.0.1:{port}"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"gpushare-dra top: cannot read http://127.0.0.1:{port}/metrics: "), res.stderr


def discover(*argv):
    out = subprocess.run([*CLI, "discover", "--device-backend", "mock", *argv], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return yaml.safe_load(out), out


def test_discover_honours_sharing_mode_and_partitions():
    doc, _ = discover("--mock-gpus", "1x80Gi", "--sharing-mode", "partition", "--partitions", "128")
    assert doc["sharing"] == {"mode": "partition", "partitions": 128}
    assert list(doc["devices"]) == ["partition"]
    shares = doc["devices"]["partition"]
    assert len(shares) == 128 and shares[-1]["name"] == "gpu-0-share-127"
    assert {d["memory"] for d in shares} == {"640Mi"}
    doc, _ = discover("--mock-gpus", "1x80Gi", "--sharing-mode", "capacity")
    assert doc["devices"] == {"capacity": [{"name": "gpu-0", "memory": "80Gi", "compute": "100"}]}
    doc, _ = discover("--mock-gpus", "1x80Gi", "--partitions", "2")  # auto: the server decides, both shown
    assert [d["name"] for d in doc["devices"]["capacity"]] == ["gpu-0"]
    assert [d["name"] for d in doc["devices"]["partition"]] == ["gpu-0-share-0", "gpu-0-share-1"]


def test_discover_output_is_accepted_as_mock_gpus(tmp_path):
    first, text = discover("--mock-gpus", "1x80Gi,1x24Gi", "--sharing-mode", "partition", "--partitions", "4")
    assert set(first["gpus"][0]) >= {"index", "memory", "uuid", "productName", "cudaComputeCapability"}
    f = tmp_path / "gpus.yaml"
    f.write_text(text)
    again, _ = discover("--mock-gpus", str(f), "--sharing-mode", "partition", "--partitions", "4")
    assert again == first


def test_discover_snake_case_keys_are_refused(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n- memory_bytes: 85899345920\n  product_name: X\n")
    assert refused(["discover", "--device-backend", "mock", "--mock-gpus", str(f)]) == (
        f"gpushare-dra discover: error: {f}: gpus[0]: unknown field(s) ['memory_bytes', 'product_name'] "
        "(accepted, camelCase: index, memory, uuid, productName, architecture, cudaComputeCapability, "
        "driverVersion, cudaDriverVersion, brand, pciBusID, pcieRoot, healthy, healthReason, migMode)")


def test_every_flag_has_an_environment_variable(monkeypatch):
    monkeypatch.setenv("GPUSHARE_PARTITIONS", "4")
    monkeypatch.setenv("GPUSHARE_SHARING_MODE", "partition")
    monkeypatch.setenv("GPUSHARE_PUBLISH_SLICES", "false")
    monkeypatch.setenv("GPUSHARE_AGENT_INTERVAL", "0.5")
    args = parse("kubelet-plugin")
    got = (args.partitions, args.sharing_mode, args.publish_slices, args.agent_interval)
    assert got == (4, "partition", False, 0.5)
    assert parse("kubelet-plugin", "--partitions", "2", "--publish-slices").partitions == 2  # the flag wins
    assert parse("kubelet-plugin", "--publish-slices").publish_slices is True
    help_text = build_parser()._subparsers._group_actions[0].choices["kubelet-plugin"].format_help()
    assert "GPUSHARE_PARTITIONS" in help_text and "GPUSHARE_CDI_ROOT" in help_text


@pytest.mark.parametrize("name, value, line", [
    ("GPUSHARE_SHARING_MODE", "bogus", "--sharing-mode: 'bogus' from $GPUSHARE_SHARING_MODE is not one of auto, "
                                       "capacity, partition"),
    ("GPUSHARE_PUBLISH_SLICES", "maybe", "--publish-slices/--no-publish-slices: 'maybe' from "
                                         "$GPUSHARE_PUBLISH_SLICES is not true or false"),
    ("GPUSHARE_PARTITIONS", "0", "--partitions: 0 is out of range 1..128"),
])
def test_a_bad_environment_variable_is_one_line(name, value, line):
    import os

    assert refused(["kubelet-plugin"], env=dict(os.environ, **{name: value})) == \
        f"gpushare-dra kubelet-plugin: error: {line}"


def test_pod_uid_from_the_downward_api_env(monkeypatch):
    monkeypatch.delenv("GPUSHARE_POD_UID", raising=False)
    assert parse("kubelet-plugin").pod_uid == ""  # rolling updates off: the contract's socket names
    uid = "0f8e3c2a-5b1d-4e7f-9a6c-2d4b8e1f3a5c"
    monkeypatch.setenv("GPUSHARE_POD_UID", uid)
    assert parse("kubelet-plugin").pod_uid == uid


def test_a_bad_pod_uid_is_one_line_naming_the_flag():
    import os

    env = dict(os.environ, GPUSHARE_POD_UID="../x")
    line = refused(["kubelet-plugin"], env=env)
    assert line.startswith("gpushare-dra kubelet-plugin: error: --pod-uid: '../x' is not a pod UID"), line


def test_device_order_flag_and_env(monkeypatch):
    monkeypatch.delenv("GPUSHARE_DEVICE_ORDER", raising=False)
    assert parse("kubelet-plugin").device_order == "binpack" and parse("controller").device_order == "binpack"
    monkeypatch.setenv("GPUSHARE_DEVICE_ORDER", "spread")
    assert parse("kubelet-plugin").device_order == "spread"
    assert parse("controller", "--device-order", "binpack").device_order == "binpack"  # the flag wins


def test_discover_prints_the_devices_in_spread_order(capsys):
    import yaml

    from dra_driver.cli import main

    assert main(["discover", "--device-backend", "mock", "--mock-gpus", "2x16Gi", "--sharing-mode", "partition",
                 "--partitions", "2", "--device-order", "spread"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert [d["name"] for d in doc["devices"]["partition"]] == ["gpu-0-share-0", "gpu-1-share-0", "gpu-0-share-1",
                                                                "gpu-1-share-1"]
