"""The child's side of the contract with the supervisor (``context.ChildContext``): what the
stages' main loops use, so no stage imports the supervisor."""
