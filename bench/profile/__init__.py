"""One stage measured on its own (``python -m bench.profile.<stage>``): the writer's CPU, the
download side beside the awscrt ceiling, the trainer's reading cost, a child's start-up."""
