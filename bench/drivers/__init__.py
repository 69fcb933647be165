"""The processes the harness starts for a run: the trainer, the awscrt driver (ceiling and lean
limit) and the paced network's proxy; each is ``python -m bench.drivers.<name>``."""
