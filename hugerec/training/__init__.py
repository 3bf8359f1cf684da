"""hugerec.training."""
