"""Pins and snapshots: what a snapshot must be (:mod:`.pin`), where a project keeps its pins
(:mod:`.project`), writing one (:mod:`.writer`), the Hugging Face cache (:mod:`.hf_cache`), building a
built-in one (:mod:`.materialize`) and a pin's tokenizer without transformers (:mod:`.tokenizer`)."""
