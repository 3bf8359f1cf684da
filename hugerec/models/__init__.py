"""hugerec.models."""
