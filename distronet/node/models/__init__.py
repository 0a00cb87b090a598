"""Models a node can train: the torch-free run spec (``spec``), the built-in byte-level GPT
(``gpt``, ``gpt_mlx``) and ``build.build_model``. Import the modules themselves: this package
imports nothing, so checking a run's model loads no torch."""
