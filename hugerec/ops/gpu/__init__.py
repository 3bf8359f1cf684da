"""hugerec.ops.gpu."""
