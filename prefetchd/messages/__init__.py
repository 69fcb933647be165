"""Every message one process writes for another: one codec shape, a version each."""
