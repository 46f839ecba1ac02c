"""MIG devices: the instance of a MIG profile placement, made when a claim of it is prepared and
destroyed with its last claim (docs/mig.md).

strategy.py: what the driver calls; ledger.py: the instances made for claims and their ledger."""
