"""The names the plugin gives a test: the parameters it fills and the fixtures it provides
(:mod:`oracles.plugin.fixtures`). Loaded in every pytest run with the plugin installed; a module of its own
so the hooks and collection read them without importing the fixtures (which pytest loads as a plugin).
"""

#: The parameters the plugin fills, and the fixtures it gives: a test using one activates the session.
PARAMETERS = frozenset({"pin", "engine_id", "port_id", "port_pin"})
FIXTURES = frozenset({"engines", "engine", "reference", "port", "judge", "pin_file", "pins", "runs", "receipt",
                      "verified_snapshot", "snapshot_overrides"}) | PARAMETERS
#: The internal mark a test gets when its pin lacks its family's token ids (refused after deselection).
TOKENS_MISSING = "oracles_tokens_missing"
