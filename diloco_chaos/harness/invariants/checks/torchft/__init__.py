"""The invariants of torchft's own history (diloco_chaos/harness/record/torchft.py), one module each, registered
for the algorithms of the torchft system (`register(systems=("torchft",))`): what a fault-tolerant trainer's
manager steps and quorums must satisfy. A sub-package so that checks/ stays within the house's 20 modules a
folder; `discover` walks it."""
