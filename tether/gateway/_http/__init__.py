"""What every route shares over HTTP: dependencies and body parsing (``deps``), the
status mapping of the gateway's errors (``status``), the record mode and the event-stream
driver, the OpenAPI document, the loading app and the servers. It knows no dialect."""

__all__: list[str] = []
