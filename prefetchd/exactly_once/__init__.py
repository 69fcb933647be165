"""Exactly once per epoch: the commit protocol, the logs it keeps and the crash recovery."""
