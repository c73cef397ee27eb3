"""Tool backends behind one port (service_layer.ports.Backends), chosen by the spec's `backend`:

- `http:<METHOD> <url template>` (or `http:<url>`, POST): plain HTTP/JSON (backends/http.py);
- `mcp:<upstream>/<tool>`: a tool of a federated upstream MCP server (backends/upstream.py);
- `adapter:<backend_id>/<operation>`: the adapter's legacy bridges over gRPC Adapter.Invoke.
"""

from services.tool_gateway.adapters.backends.router import Backend, BackendRouter

__all__ = ["Backend", "BackendRouter"]
