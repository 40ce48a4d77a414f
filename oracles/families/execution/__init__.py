"""The execution families (mtplx, mtplx_chat, port): prompt records (:mod:`.prompts`), greedy
decode through a cache (:mod:`.decode`), chats (:mod:`.chat`), speculative cycles (:mod:`.speculative`),
the session runs they share (:mod:`.runs`) and where a port first diverges (:mod:`.localise`)."""
