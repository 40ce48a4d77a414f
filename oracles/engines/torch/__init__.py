"""The torch engines: the transformers reference (:mod:`.reference`) on the CPU or an accelerator
(:mod:`.cuda`), its vision path (:mod:`.vision`), batched cohort decode (:mod:`.cohort`) and layer taps
(:mod:`.taps`). torch is imported when an engine is built, never at import."""
