"""sharingStrategy MPS: one MPS control daemon per GPU serves the GPU's MPS claims (docs/strategies.md).

strategy.py: what the driver calls; control.py: the daemon; layout.py: its folders and names;
root.py: running NVIDIA's daemon chrooted in the driver root."""
