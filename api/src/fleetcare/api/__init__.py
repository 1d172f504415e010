"""fleetcare.api."""
