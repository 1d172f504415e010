"""The API's routes, one router per area; ``fleetcare.api.app.create_app`` includes them.

- ``service``    — ``/healthz``, ``/metrics`` (open)
- ``risk``       — ``/v1/risk``, ``/v1/drain-candidates``, ``/v1/model``
- ``nodes``      — ``/v1/nodes/{node}`` (+ ``/labels``, ``/history``), ``/v1/gpus/{uuid}``
- ``operations`` — ``/v1/drains``, ``/v1/alerts``, ``/v1/incidents``
- ``tokens``     — ``/v1/tokens``
- ``web``        — the dashboard's HTML pages and sign-in (``/``, ``/nodes/{node}``, ...)
- ``docs``       — ``/docs`` (vendored Swagger UI 5)

``deps`` holds what they share (cursor, scopes, the app's context).
"""
