"""hugerec.ops.cpu."""
