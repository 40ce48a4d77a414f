"""Recordings (``docs/recordings.md``): the answers one engine gave, content-addressed on disk, and a recording
as an engine.

=============  ==================================================================================
``keys``       the canonical form of a request (RFC 8785), its key, the lineages that name caches
``store``      the layout on disk: ``store.json``, contexts, entries (wire frames); atomic writes; checked reads
``handles``    what a recording and a replay share: handles, keys, refusals
``recorder``   ``--record ENGINE=DIR``: an engine's class whose every carried call is written
``replay``     ``recorded:DIR``: every call answered from the store, nothing computed
``check``      ``oracles recording-check DIR``: a store's conformance to its layout
=============  ==================================================================================

Importing this package imports numpy and the wire's pure modules, nothing heavy.
"""
