"""The child's side of the contract with the supervisor."""
