"""dra_driver.runloop.serve: the run loop of the plugin, the controller and the emulator."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVICE = textwrap.dedent("""
    import os, signal, sys, threading, time
    from dra_driver.log import configure, get_logger
    from dra_driver.runloop import serve

    configure("info", "console")

    class Service:
        def stop(self):
            print("stopped", flush=True)

    def start():
        if sys.argv[1] == "during-start":  # the signal arrives before the service is up
            os.kill(os.getpid(), int(sys.argv[2]))
        if sys.argv[1] == "to-another-thread":  # as the kernel may deliver it to a gRPC thread
            def raise_here():
                time.sleep(0.5)  # the main thread is waiting by then
                signal.pthread_kill(threading.get_ident(), int(sys.argv[2]))
            threading.Thread(target=raise_here, daemon=True).start()
        print("started", flush=True)
        return Service()

    sys.exit(serve(start, get_logger("test"), "stopping"))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("when", ["during-start", "while-serving", "to-another-thread"])
def test_a_signal_stops_the_service_cleanly(sig, when):
    proc = subprocess.Popen([sys.executable, "-c", SERVICE, when, str(int(sig))], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout.readline() == "started\n"
    if when == "while-serving":
        proc.send_signal(sig)
    proc.wait(timeout=30)
    out = proc.stdout.read()  # (not communicate(): it would skip what readline() buffered)
    assert proc.returncode == 0, out
    assert "stopping" in out and "stopped\n" in out and out.index("stopping") < out.index("stopped"), out


def test_an_error_in_start_propagates_without_waiting():
    code = SERVICE.replace('print("started", flush=True)', 'raise ValueError("--flag: bad value")')
    proc = subprocess.run([sys.executable, "-c", code, "-", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 1 and "ValueError: --flag: bad value" in proc.stderr, proc.stderr
