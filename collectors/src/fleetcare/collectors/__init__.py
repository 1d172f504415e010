"""fleetcare.collectors: the node agent, its GPU backends, the data contract and transports.

Nothing here imports the pipeline, models or API: data flows collectors → pipeline →
models → api, and so do imports.
"""
