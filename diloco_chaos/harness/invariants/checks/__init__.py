"""The invariants, one module each; every module registers its invariant
(diloco_chaos.harness.invariants.registry.register).

Adding an invariant is adding a module here: `diloco_chaos.harness.invariants.registry.discover` imports them all.
Modules whose name starts with an underscore hold shared helpers and register nothing.
"""
