"""Stage 3, inside the trainer: claim finished shards and read them."""
