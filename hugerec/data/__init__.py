"""hugerec.data."""
