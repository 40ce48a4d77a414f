"""The cohort family: serial vs batched lanes (:mod:`.run`), grow to an anchor with snapshot/restore
(:mod:`.anchor`), and the paired benchmark (:mod:`.bench`)."""
