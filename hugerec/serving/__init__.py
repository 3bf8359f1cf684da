"""hugerec.serving."""
