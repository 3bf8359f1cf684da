"""hugerec.distributed."""
