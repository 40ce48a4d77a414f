"""Tiny seeded twins: snapshots built from transformers' own config and model classes at tiny sizes,
pinned as ``twin:NAME#SEED`` and built by ``oracles materialize`` (:data:`oracles.materialize.TWINS`)."""
