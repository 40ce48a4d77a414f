"""The MLX engines: mlx-lm (:mod:`.lm`, with hybrid models in :mod:`.hybrid`, cohort decode in
:mod:`.cohort`, layer taps in :mod:`.taps`), mlx-vlm (:mod:`.vlm`) and mtplx on macOS (:mod:`.mtplx`). mlx
is imported when an engine is built, never at import."""
