"""Machinery that makes the lesson run: sampling (transformers and vLLM), the update's
speed-ups, the embedded tiny model, data, checkpoints and the command-line config."""
