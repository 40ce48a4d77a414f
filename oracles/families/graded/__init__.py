"""The graded figures: llama-perplexity's ``--kl-divergence`` statistics of a port against a
reference over the shipped corpus (:mod:`.corpus`), the runs (:mod:`.run`) and llama.cpp's
``--kl-divergence-base`` file (:mod:`.kld_file`)."""
