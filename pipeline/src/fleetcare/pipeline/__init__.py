"""fleetcare.pipeline."""
