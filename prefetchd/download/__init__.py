"""Stage 1: list the source, order each epoch, fetch objects into ``download.cache_dir``,
verify them."""
