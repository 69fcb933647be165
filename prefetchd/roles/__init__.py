"""The child processes: the role table (``table.py``) and the process shell that runs a stage
(``shell.py``). The supervisor imports roles; roles import the stages (inside the child only)."""
