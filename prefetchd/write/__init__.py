"""Stage 2: turn downloaded objects into records and write TFRecord shards to output.ram_dir."""
