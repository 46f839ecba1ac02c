"""Node agent: per-claim telemetry, measured compute shares and a backstop against escapes.

Runs inside the kubelet-plugin process (kubeletplugin/main.py starts and stops it); see
docs/agent.md. `Agent` in agent.py ties the parts together.
"""
