"""The `prefetchd run` process: start, watch and stop the children; status, metrics, systemd."""
