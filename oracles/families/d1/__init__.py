"""The d1 family: requests and typed questions (:mod:`.records`), per-tokenizer rows (:mod:`.rows`),
the row and tree runs (:mod:`.run`) and the red-arm candidates (:mod:`.arms`)."""
