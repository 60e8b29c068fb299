"""Training speculators: one trainer loop (`trainer`), one objective module per trainable drafter
(`eagle3_objective`), data batching and packing (`data`), the frozen target's online features
(`target_pass`), atomic checkpoints (`checkpoint`), data parallelism (`distributed`) and held-out
tau with the real engine (`evaluate`)."""
