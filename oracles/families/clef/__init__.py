"""The clef family: typed questions about pictures (:mod:`.records`) and their runs on a
vision-language engine (:mod:`.run`)."""
