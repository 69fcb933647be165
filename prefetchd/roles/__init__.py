"""The child processes: the role table and the process shell that runs a stage."""
