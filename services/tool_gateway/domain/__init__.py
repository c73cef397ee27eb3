from services.tool_gateway.domain.registry import ToolSpec, validate_spec

__all__ = ["ToolSpec", "validate_spec"]
