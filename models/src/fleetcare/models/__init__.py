"""fleetcare.models."""
