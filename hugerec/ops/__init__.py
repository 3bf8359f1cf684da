"""hugerec.ops."""
