"""One module per training method: how it builds its draft, runs a step, and saves the folder its
drafter loads. The loop (`train/trainer.py`) knows none of them by name beyond `METHODS`."""
